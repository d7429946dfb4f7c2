"""Process groups shared by every ``ProcessMesh`` of one torch.distributed world.

[Note: shared groups] A process group is a set of ranks; two meshes of one world that need the
same set (the ``dp`` groups of ``dp2 tp2`` and of ``dp2 pp2``, every rank's own singleton
group) get the same group object, created once. Creating a group is collective and costs a
rendezvous through the store (and, on gloo, a connection per pair of members), which is most of
building a small mesh. The cache belongs to the world: it is keyed by the world's default group
(weakly, so ``destroy_process_group()`` and a new ``init_process_group()`` start an empty one),
which torch itself keeps as the one registry of a process's groups. Every rank builds the same
meshes in the same order, so every rank hits and misses the cache on the same rank sets and
the creations stay collective. ``ProcessMesh.close()`` leaves shared groups alive;
``release_shared_groups()`` (collective) destroys them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch.distributed as dist

from colossal_contracts import DistributedError

__all__ = ["GroupStats", "release_shared_groups", "shared_group", "shared_group_stats"]


@dataclass
class GroupStats:
    """How the current world's shared groups were obtained.

    Attributes:
        created: groups created (one ``new_group`` call each, collective).
        reused: requests answered from the cache, with no collective.
        live: groups held now (this rank a member or not).
    """

    created: int = 0
    reused: int = 0
    live: int = 0


@dataclass
class _WorldGroups:
    groups: dict[tuple[int, ...], dist.ProcessGroup] = field(default_factory=dict)  # ranks -> group
    stats: GroupStats = field(default_factory=GroupStats)


# The default group of each live world -> its shared groups ([Note: shared groups]).
_WORLDS: weakref.WeakKeyDictionary[object, _WorldGroups] = weakref.WeakKeyDictionary()


def _world() -> _WorldGroups:
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError(
            "shared process groups need torch.distributed initialised; call launch_from_torch() "
            "or torch.distributed.init_process_group() first"
        )
    return _WORLDS.setdefault(dist.group.WORLD, _WorldGroups())


def shared_group(ranks: list[int] | tuple[int, ...]) -> dist.ProcessGroup:
    """The world's group of exactly ``ranks`` (ordered as ``new_group`` orders them: by rank),
    created on first request.

    Collective on a miss: every rank of the world asks for the same rank sets in the same order
    (as every rank builds the same meshes). A rank outside ``ranks`` gets what ``new_group``
    gives it (not a member)."""
    key = tuple(sorted(int(r) for r in ranks))
    world = _world()
    group = world.groups.get(key)
    if group is None:
        group = dist.new_group(list(key))
        world.groups[key] = group
        world.stats.created += 1
    else:
        world.stats.reused += 1
    world.stats.live = len(world.groups)
    return group


def shared_group_stats() -> GroupStats:
    """A copy of the current world's counts (all zero before any mesh was built)."""
    if not dist.is_available() or not dist.is_initialized():
        return GroupStats()
    world = _WORLDS.get(dist.group.WORLD)
    if world is None:
        return GroupStats()
    return GroupStats(world.stats.created, world.stats.reused, len(world.groups))


def release_shared_groups() -> int:
    """Destroy the current world's shared groups that this rank is in, and forget all of them
    (collective: every rank calls it, after the last mesh using them is done). Returns how many
    groups this rank destroyed. The counts start again at zero."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    world = _WORLDS.pop(dist.group.WORLD, None)
    if world is None:
        return 0
    me = dist.get_rank()
    destroyed = 0
    for ranks, group in world.groups.items():
        if me in ranks:
            dist.destroy_process_group(group)
            destroyed += 1
    return destroyed

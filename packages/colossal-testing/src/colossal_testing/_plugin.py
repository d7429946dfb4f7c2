"""pytest plugin: the ``world`` fixture hands out one cached ``World`` per size per session.

A suite names the modules its ranks need by overriding the session fixture ``world_preload``
(a tuple of module names, empty by default): the fork server imports them once, beside torch,
instead of every rank importing them (see [Note: forked ranks] in ``_world``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ._world import PRELOAD, World


@pytest.fixture(scope="session")
def world_preload() -> tuple[str, ...]:
    """Modules (besides torch) that every rank imports before its first task; override per suite."""
    return ()


@pytest.fixture(scope="session")
def world(world_preload: tuple[str, ...]) -> Iterator[Callable[[int], World]]:
    """``world(n)`` returns the session's n-rank world, starting it on first use."""
    worlds: dict[int, World] = {}

    def get(n: int) -> World:
        if n not in worlds:
            worlds[n] = World(n, preload=PRELOAD + tuple(world_preload))
        return worlds[n]

    yield get
    for w in worlds.values():
        w.close()

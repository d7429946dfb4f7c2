"""``ChunkManager.gather_ahead`` under a budget on 2 gloo ranks ([Note: gathers ahead], [Note:
gathers from the host]), and an access that makes room by evicting a chunk whose reduce-scatter
is in flight (finished first: [Note: collectives in flight])."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _checks_gathers_ahead as checks
import torch


def test_gathers_ahead_stage_host_shards_and_evict_only_chunks_used_later(world):
    shard = 4 * checks.N // 2  # fp32 bytes of one rank's shard
    for out in world(2).run(checks.gathers_ahead_evict_only_later_chunks):
        # moment 0: c1's shard and buffer do not fit beside c0 and c2's shard, so c1 is
        # gathered from its host shard ([Note: gathers from the host]: the shard stays there,
        # its staging counted as a move in); c2, used after c1, made room for the buffer
        assert out["issued at 0"] == 1
        assert out["c1 at 0"] == ("host", True)
        assert out["c2 at 0"] == "host"
        assert out["within budget at 0"]
        # in: c2 (by the check), c0 (it fit), c1's staging; out: c2 (evicted)
        assert out["host -> acc after 0"] == 3 * shard
        assert out["acc -> host after 0"] == shard
        assert out["p1 equal"]
        # moment 1: c2's buffer fits beside c0's shard and c1's buffer, its shard does not:
        # gathered from the host too, and c0 (used before c2) stays
        assert out["issued at 1"] == 1
        assert out["c0 at 1"] == "accelerator"
        assert out["c2 at 1"] == ("host", True)
        assert out["acc -> host after 1"] == 2 * shard  # c1's slice copied back
        assert out["p0 equal"]


def test_an_access_evicts_a_chunk_with_a_reduce_scatter_in_flight(world):
    for out in world(2).run(checks.reduce_in_flight_makes_room):
        assert out["in flight"]  # it holds c0's gathered buffer
        assert not out["c0 in flight after"]  # finished by its eviction
        assert out["within budget"] and out["p1 equal"]
        assert torch.equal(out["c0 shard"], torch.full_like(out["c0 shard"], out["mean"]))


def test_gathers_started_together_are_one_collective(world):
    """[Note: coalesced gathers]: three chunks of one ``gather_ahead`` are one collective with
    torch's coalescing manager (three without it); every chunk then holds its own values,
    whichever of them is waited for first."""
    for coalesce, collectives in ((True, 1), (False, 3)):
        for out in world(2).run(checks.coalesced_gathers, coalesce):
            assert out["issued"] == 3
            assert out["in flight"] == [True, True, True]
            assert out["equal"] == [True, True, True]
            assert sum(out["ops"].values()) == collectives, out["ops"]

"""``ChunkManager.gather_ahead`` under a budget on 2 gloo ranks ([Note: gathers ahead])."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _checks_gathers_ahead as checks


def test_gathers_ahead_bring_shards_in_and_evict_only_chunks_used_later(world):
    for out in world(2).run(checks.gathers_ahead_evict_only_later_chunks):
        # moment 0: c1's shard came from the host and its gather is in flight; c2 made room
        assert out["issued at 0"] == 1
        assert out["c1 at 0"] == ("accelerator", True)
        assert out["c2 at 0"] == "host"
        assert out["within budget at 0"]
        assert out["p1 equal"]
        # moment 1: only c0 could make room, and it is used before c2: nothing is evicted
        assert out["issued at 1"] == 0
        assert out["c0 at 1"] == "accelerator"
        assert out["c2 at 1"] == ("host", False)
        assert out["p0 equal"]

"""Run on every rank by test_chunk_group.py: a chunk's lifecycle through its collectives, the
manager's count of collectives in flight, and ``reshard`` against hooks that keep buffers."""

import torch
import torch.distributed as dist

from colossal_chunk import ChunkConfig, ChunkManager, Lifecycle
from colossal_contracts import TensorState

N = 64  # elements per parameter and per chunk


class _KeepAll:
    """ManagerHooks that keep every chunk gathered and count the collectives announced."""

    def __init__(self) -> None:
        self.announced: list[str] = []

    def before_collective(self, kind: str, chunk: object) -> None:
        self.announced.append(kind)

    def keep_gathered(self, chunk: object) -> bool:
        return True


def lifecycle_through_collectives() -> dict[str, object]:
    hooks = _KeepAll()
    config = ChunkConfig(chunk_numel=N, disk_bytes=0, device="cpu")
    m = ChunkManager(config, group=dist.group.WORLD, hooks=hooks)
    params = [torch.nn.Parameter(torch.arange(N, dtype=torch.float32) + 100 * i) for i in range(2)]
    c0, c1 = m.register([(f"p{i}", p) for i, p in enumerate(params)])
    out: dict[str, object] = {"registered": c0.lifecycle}
    m.gather_ahead([c0])
    out["gathering"], out["in flight"] = c0.lifecycle, len(m.in_flight)
    m.access(["p0"])  # finishes the gather
    out["accessed"], out["in flight after access"] = c0.lifecycle, len(m.in_flight)
    m.release(["p0"])  # the hooks keep it gathered
    out["kept gathered"] = c0.lifecycle
    m.settle([c0], reshard=True)  # whatever the hooks say
    out["resharded"] = c0.lifecycle
    m.access(["p1"])
    params[1].data.fill_(dist.get_rank() + 1.0)
    m.release(["p1"], state=TensorState.READY_FOR_REDUCE, reshard=False)
    m.reduce(c1, async_op=True)
    out["reducing"], out["in flight while reducing"] = c1.lifecycle, len(m.in_flight)
    m.settle()
    out["settled"], out["in flight after settle"] = c1.lifecycle, len(m.in_flight)
    out["most"] = m.in_flight.most
    out["announced"] = list(hooks.announced)
    m.close()
    return out


EXPECTED = {
    "registered": Lifecycle.SHARDED,
    "gathering": Lifecycle.GATHERING,
    "in flight": 1,
    "accessed": Lifecycle.GATHERED,
    "in flight after access": 0,
    "kept gathered": Lifecycle.GATHERED,
    "resharded": Lifecycle.SHARDED,
    "reducing": Lifecycle.REDUCING,
    "in flight while reducing": 1,
    "settled": Lifecycle.SHARDED,
    "in flight after settle": 0,
    "most": 1,
    "announced": ["all-gather", "all-gather", "reduce-scatter"],
}

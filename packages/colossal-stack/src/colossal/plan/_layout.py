"""A training layout (how devices and memory are used) and the enumeration of the candidates."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["METHODS", "TP_MODES", "Layout", "enumerate_layouts"]

# Data-parallel methods: plain DDP, ZeRO-1/2, and Gemini (ZeRO-3 chunks) with its tiers:
# everything on the device, optimizer states on the host, all model states on the host,
# optimizer states on disk (fp16 parameters and gradients on the host).
METHODS = ("ddp", "zero1", "zero2", "gemini", "gemini-host", "gemini-host-all", "gemini-disk")
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2}
TP_MODES = ("1d", "1d-sp", "2d", "2.5d", "3d")
# The runtime's attention is fused (it saves no scores), so selective recomputation would
# recompute nothing: the candidates are none and full (whole blocks).
RUNTIME_RECOMPUTE = ("none", "full")


@dataclass(frozen=True)
class Layout:
    """``dp x pp x tp x sp`` devices, a data-parallel ``method``, ``micro_batch`` samples per
    micro-batch (``num_micro`` of them per step and data-parallel rank), and ``recompute``.

    ``tp_mode`` ``1d-sp`` is Megatron 1D with its sequence parallelism; ``depth`` is the 2.5D
    depth. ``sp`` is ring/Ulysses context parallelism. Axes are placed tp innermost, then sp, dp,
    pp (outermost), so the inner axes use the intra-node link first.
    """

    dp: int
    pp: int
    tp: int
    tp_mode: str
    sp: int
    method: str
    micro_batch: int
    num_micro: int
    recompute: str
    depth: int = 1

    @property
    def devices(self) -> int:
        return self.dp * self.pp * self.tp * self.sp

    @property
    def grid_q(self) -> int:
        """The size of one grid axis of a 2D/2.5D/3D mode (``tp`` for 1D)."""
        if self.tp_mode == "2d":
            return round(self.tp**0.5)
        if self.tp_mode == "2.5d":
            return round((self.tp // self.depth) ** 0.5)
        if self.tp_mode == "3d":
            return round(self.tp ** (1 / 3))
        return self.tp

    def describe(self) -> str:
        tp = f"tp{self.tp_mode}x{self.tp}" + (f"(d{self.depth})" if self.tp_mode == "2.5d" else "")
        return (
            f"dp{self.dp} pp{self.pp} {tp} sp{self.sp} {self.method} "
            f"mb{self.micro_batch}x{self.num_micro} rc-{self.recompute}"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_choices(devices: int, heads: int, modes: tuple[str, ...]) -> Iterator[tuple[str, int, int]]:
    for mode in modes:
        if mode in ("1d", "1d-sp"):
            for t in (1, 2, 4, 8, 16, 32, 64):
                if devices % t == 0 and heads % t == 0 and not (mode == "1d-sp" and t == 1):
                    yield mode, t, 1
        elif mode == "2d":
            for q in (2, 4, 8):
                if devices % (q * q) == 0 and heads % q == 0:
                    yield mode, q * q, 1
        elif mode == "2.5d":
            for q in (2, 4):
                for d in (2, 4):
                    if devices % (d * q * q) == 0 and heads % q == 0:
                        yield mode, d * q * q, d
        elif mode == "3d":
            for q in (2, 4):
                if devices % q**3 == 0 and heads % q == 0:
                    yield mode, q**3, 1


def enumerate_layouts(
    devices: int,
    *,
    layers: int,
    heads: int,
    seq_len: int,
    global_batch: int,
    tp_modes: tuple[str, ...] = TP_MODES,
    methods: tuple[str, ...] = METHODS,
    recompute: tuple[str, ...] = RUNTIME_RECOMPUTE,
    max_sp: int = 8,
) -> Iterator[Layout]:
    """Every layout on exactly ``devices`` devices that the runtime can build: tp divides the
    heads, pp the layers, dp the global batch; sp (ring) divides ``seq_len / 2``; ZeRO-2 and Gemini
    only without pipeline stages (as HybridParallelPlugin allows); micro-batches of 1..16 samples."""
    for mode, tp, depth in _tp_choices(devices, heads, tp_modes):
        for sp in _divisors(devices // tp):
            if sp > max_sp or seq_len % (2 * sp) or (sp > 1 and (heads // tp) < 1):
                continue
            for pp in _divisors(devices // (tp * sp)):
                if layers % pp:
                    continue
                dp = devices // (tp * sp * pp)
                if global_batch % dp:
                    continue
                per_rank = global_batch // dp
                for method in methods:
                    if pp > 1 and method not in ("ddp", "zero1"):
                        continue
                    for mb in (1, 2, 4, 8, 16):
                        if per_rank % mb:
                            continue
                        for rc in recompute:
                            yield Layout(
                                dp, pp, tp, mode, sp, method, mb, per_rank // mb, rc, depth
                            )

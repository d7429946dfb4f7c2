"""A training layout (how devices and memory are used) and the enumeration of the candidates."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from colossal_contracts import ConfigError

from .._capability import Combination, builds, check_combination

__all__ = [
    "METHODS",
    "SP_KINDS",
    "TP_MODES",
    "Layout",
    "check_layout",
    "enumerate_layouts",
    "parse_layout",
]

# Data-parallel methods: plain DDP, ZeRO-1/2, and Gemini (ZeRO-3 chunks) with its tiers:
# everything on the device, optimizer states on the host, all model states on the host,
# optimizer states on disk (fp16 parameters and gradients on the host).
METHODS = ("ddp", "zero1", "zero2", "gemini", "gemini-host", "gemini-host-all", "gemini-disk")
ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2}
TP_MODES = ("1d", "1d-sp", "2d", "2.5d", "3d")
# The runtime's attention is fused (it saves no scores), so selective recomputation would
# recompute nothing: the candidates are none and full (whole blocks).
RUNTIME_RECOMPUTE = ("none", "full")
SP_KINDS = ("ring", "ulysses")


@dataclass(frozen=True)
class Layout:
    """``dp x pp x tp x sp`` devices, a data-parallel ``method``, ``micro_batch`` samples per
    micro-batch (``num_micro`` of them per step and data-parallel rank), and ``recompute``.

    ``tp_mode`` ``1d-sp`` is Megatron 1D with its sequence parallelism; ``depth`` is the 2.5D
    depth. ``sp`` ranks run ``sp_kind`` ("ring" or "ulysses") context parallelism. Axes are
    placed tp innermost, then sp, dp, pp (outermost), so the inner axes use the intra-node link
    first. ``describe()`` is the layout's text form and ``parse_layout`` reads it back.
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
    sp_kind: str = "ring"

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

    def combination(self, precision: str = "bf16") -> Combination:
        """The kinds this layout composes, for the capability table ([Note: capability table])."""
        tp = "none" if self.tp == 1 else ("1d" if self.tp_mode.startswith("1d") else self.tp_mode)
        megatron = self.tp_mode == "1d-sp" and self.tp > 1
        sp = "megatron" if megatron else "none"
        if self.sp > 1:
            sp = f"{self.sp_kind}+megatron" if megatron else self.sp_kind
        return Combination(
            tp=tp,
            sp=sp,
            pp="1f1b" if self.pp > 1 else "none",
            sharding="zero0" if self.method == "ddp" else self.method.split("-")[0],
            precision=precision,
            checkpointing=self.recompute == "full",
        )

    def describe(self) -> str:
        """The text form, e.g. ``dp2 pp2 tp2-sp zero1 mb2x4 ckpt``: axes of size 1 left out
        (``dp`` always shown); ``parse_layout`` reads it back."""
        parts = [f"dp{self.dp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.tp > 1:
            mode = {"1d": "", "1d-sp": "-sp"}.get(self.tp_mode, f"-{self.tp_mode}")
            parts.append(
                f"tp{self.tp}{mode}" + (f"-d{self.depth}" if self.tp_mode == "2.5d" else "")
            )
        if self.sp > 1:
            parts.append(f"{self.sp_kind}{self.sp}")
        parts.append(self.method)
        parts.append(f"mb{self.micro_batch}x{self.num_micro}")
        if self.recompute != "none":
            parts.append("ckpt" if self.recompute == "full" else f"rc-{self.recompute}")
        return " ".join(parts)


_GRAMMAR = (
    "write e.g. 'dp2 tp2 zero1 mb4x1' or 'dp1 pp2 tp2-sp zero1 mb2x4 ckpt': dpN, optional ppN, "
    "tpN[-sp|-2d|-2.5d-dD|-3d], ringN or ulyssesN, one of "
    + ", ".join(METHODS)
    + ", mbBxM (B samples per micro-batch, M micro-batches), optional ckpt"
)
_TOKEN = re.compile(
    r"dp(?P<dp>\d+)|pp(?P<pp>\d+)|tp(?P<tp>\d+)(?P<mode>-sp|-2d|-2\.5d-d(?P<d>\d+)|-3d)?"
    r"|(?P<spk>ring|ulysses)(?P<sp>\d+)|mb(?P<mb>\d+)x(?P<m>\d+)|(?P<ckpt>ckpt)"
)


def parse_layout(text: str) -> Layout:
    """The ``Layout`` that ``describe()`` printed as ``text``; ``ConfigError`` naming the token
    that does not read (this checks the spelling only: ``check_layout`` checks that it builds)."""
    seen: set[str] = set()  # the parts given, each at most once
    dp: int | None = None
    method: str | None = None
    pp, ckpt = 1, False
    tp: tuple[int, str, int] = (1, "1d", 1)  # size, mode, depth
    sp: tuple[int, str] = (1, "ring")  # size, kind
    mb: tuple[int, int] | None = None  # samples per micro-batch, micro-batches

    def once(key: str, token: str) -> None:
        if key in seen:
            raise ConfigError(f"layout {text!r}: {token!r} repeats a part given before; {_GRAMMAR}")
        seen.add(key)

    for token in text.split():
        if token in METHODS:
            once("method", token)
            method = token
            continue
        m = _TOKEN.fullmatch(token)
        if m is None:
            raise ConfigError(f"layout {text!r}: cannot read {token!r}; {_GRAMMAR}")
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        if "dp" in g:
            once("dp", token)
            dp = int(g["dp"])
        elif "pp" in g:
            once("pp", token)
            pp = int(g["pp"])
        elif "tp" in g:
            once("tp", token)
            mode = (g.get("mode") or "").lstrip("-")
            mode = {"": "1d", "sp": "1d-sp"}.get(mode, mode.split("-")[0])
            tp = (int(g["tp"]), mode, int(g.get("d", 1)))
        elif "sp" in g:
            once("sp", token)
            sp = (int(g["sp"]), g["spk"])
        elif "mb" in g:
            once("mb", token)
            mb = (int(g["mb"]), int(g["m"]))
        else:
            once("ckpt", token)
            ckpt = True
    if dp is None or method is None or mb is None:
        need = "dp" if dp is None else "method" if method is None else "mb"
        raise ConfigError(f"layout {text!r} has no {need} part; {_GRAMMAR}")
    (tp_size, mode, depth), (sp_size, kind), (micro, num_micro) = tp, sp, mb
    sizes = {"dp": dp, "pp": pp, "tp": tp_size, "sp": sp_size, "mb": micro, "x": num_micro}
    for name, v in {**sizes, "d": depth}.items():
        if v < 1:
            raise ConfigError(f"layout {text!r}: {name} must be positive, got {v}")
    return Layout(
        dp,
        pp,
        tp_size,
        mode,
        sp_size,
        method,
        micro,
        num_micro,
        "full" if ckpt else "none",
        depth,
        kind,
    )


def check_layout(lay: Layout, precision: str = "bf16") -> None:
    """``ConfigError`` unless the runtime builds ``lay``'s kinds at ``precision``, naming the
    nearest combination that builds; and unless its sizes are whole (a 2d tp of q*q ranks, a
    2.5d of q*q*depth, a 3d of q**3, one micro-batch per step without pipeline stages)."""
    check_combination(lay.combination(precision), what=f"layout {lay.describe()!r}")
    if lay.pp == 1 and lay.num_micro != 1:
        raise ConfigError(
            f"layout {lay.describe()!r}: {lay.num_micro} micro-batches need pipeline stages "
            f"(no gradient accumulation without them); use mb{lay.micro_batch * lay.num_micro}x1"
        )
    q = lay.grid_q
    want = {"2d": q * q, "2.5d": q * q * lay.depth, "3d": q**3}.get(lay.tp_mode, lay.tp)
    if lay.tp > 1 and want != lay.tp:
        raise ConfigError(
            f"layout {lay.describe()!r}: tp{lay.tp} is not a whole {lay.tp_mode} grid "
            "(2d: q*q ranks, 2.5d: q*q*depth, 3d: q**3)"
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


def _batch_ranks(mode: str, tp: int, depth: int) -> int:
    """The tp ranks a grid mode splits each (micro-)batch over: 2D q, 2.5D d q, 3D q^2."""
    if mode == "2d":
        return math.isqrt(tp)
    if mode == "2.5d":
        return depth * math.isqrt(tp // depth)
    if mode == "3d":
        return round(tp ** (2 / 3))
    return 1


def _sp_choices(devices: int, heads: int, seq_len: int, max_sp: int) -> Iterator[tuple[int, str]]:
    """``(sp, kind)``: ring splits each sequence into ``2 sp`` zigzag parts, Ulysses the heads
    (of one tp rank) and the sequence into ``sp``."""
    yield 1, "ring"
    for sp in _divisors(devices)[1:]:
        if sp > max_sp:
            break
        if seq_len % (2 * sp) == 0:
            yield sp, "ring"
        if seq_len % sp == 0 and heads % sp == 0:
            yield sp, "ulysses"


def enumerate_layouts(
    devices: int,
    *,
    layers: int,
    heads: int,
    seq_len: int,
    global_batch: int,
    precision: str | None = "bf16",
    tp_modes: tuple[str, ...] = TP_MODES,
    methods: tuple[str, ...] = METHODS,
    recompute: tuple[str, ...] = RUNTIME_RECOMPUTE,
    max_sp: int = 8,
) -> Iterator[Layout]:
    """Every layout on exactly ``devices`` devices that the runtime builds at ``precision``: its
    kinds pass the capability table ([Note: capability table]); tp divides the heads, pp the
    layers, dp the global batch; ring sp divides ``seq_len / 2``, Ulysses sp the sequence and the
    heads of one tp rank; a grid mode's batch ranks divide the micro-batch; micro-batches of 1..16 samples, more than one per step only with pipeline stages.
    ``precision`` None skips the capability table (a peer's layouts, for comparisons)."""
    for mode, tp, depth in _tp_choices(devices, heads, tp_modes):
        for sp, kind in _sp_choices(devices // tp, heads // tp, seq_len, max_sp):
            for pp in _divisors(devices // (tp * sp)):
                if layers % pp:
                    continue
                dp = devices // (tp * sp * pp)
                if global_batch % dp:
                    continue
                per_rank = global_batch // dp
                for method in methods:
                    for mb in (1, 2, 4, 8, 16) if pp > 1 else (per_rank,):
                        if per_rank % mb or mb % _batch_ranks(mode, tp, depth):
                            continue
                        for rc in recompute:
                            lay = Layout(
                                dp, pp, tp, mode, sp, method, mb, per_rank // mb, rc, depth, kind
                            )
                            if precision is None or builds(lay.combination(precision)):
                                yield lay

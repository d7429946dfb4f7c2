"""``MeshConfig``: the sizes of the parallel axes and the tensor-parallel mode, validated once.

[Note: rank layout] Global ranks are laid out row-major over ``(pp, dp, sp, *tp_layout)``,
outermost first, so the ranks of one tensor-parallel block are contiguous (``sp`` is the
long-sequence axis of ring attention and Ulysses; it has size 1 unless asked for). The group along an axis is the set
of ranks that differ only in that axis' coordinate, and ``coord(axis)`` is a rank's index inside it.

======  =====================================  ==========================  =========
mode    axes                                   layout (outermost first)    shape
======  =====================================  ==========================  =========
1d      ``tp``                                 ``tp``                      ``(p,)``
2d      ``tp_row, tp_col``                     ``tp_col, tp_row``          ``(q, q)``
2.5d    ``tp_dep, tp_row, tp_col``             ``tp_dep, tp_col, tp_row``  ``(d, q, q)``
3d      ``tp_in, tp_wt, tp_out``               ``tp_in, tp_wt, tp_out``    ``(q, q, q)``
======  =====================================  ==========================  =========

2D (and each depth layer of 2.5D): the rank at block ``(i, j)`` of a ``q x q`` blocked matrix is
``i*q + j`` within the block. ``group("tp_row")`` is *row* i (ranks varying j), so
``coord("tp_row") == j``; ``group("tp_col")`` is *column* j (ranks varying i), so
``coord("tp_col") == i``. That is why the layout lists ``tp_col`` (the dimension indexed by i)
before ``tp_row``. For the multi-dimensional modes the axis ``tp`` also exists and spans the whole
block, with ``coord("tp")`` the rank's index inside the block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from colossal_contracts import ConfigError

__all__ = ["TP_MODES", "MeshConfig", "TpMode", "divide", "require_plain_embedding"]

TpMode = Literal["1d", "2d", "2.5d", "3d"]
TP_MODES: tuple[str, ...] = ("1d", "2d", "2.5d", "3d")

_TP_AXES: dict[str, tuple[str, ...]] = {
    "1d": ("tp",),
    "2d": ("tp_row", "tp_col"),
    "2.5d": ("tp_dep", "tp_row", "tp_col"),
    "3d": ("tp_in", "tp_wt", "tp_out"),
}
# The same names in layout order (see [Note: rank layout]).
_TP_LAYOUT: dict[str, tuple[str, ...]] = {
    "1d": ("tp",),
    "2d": ("tp_col", "tp_row"),
    "2.5d": ("tp_dep", "tp_col", "tp_row"),
    "3d": ("tp_in", "tp_wt", "tp_out"),
}


def _int_root(n: int, k: int) -> int | None:
    """The integer ``r`` with ``r**k == n``, or None."""
    r = round(n ** (1.0 / k))
    for c in (r - 1, r, r + 1):
        if c >= 1 and c**k == n:
            return c
    return None


def divide(size: int, parts: int, *, what: str = "dimension") -> int:
    """``size // parts``; ``ConfigError`` naming ``what`` when ``parts`` does not divide ``size``."""
    if parts < 1 or size % parts != 0:
        raise ConfigError(
            f"{what} of size {size} cannot be split into {parts} equal parts; choose a size "
            f"that is a multiple of {parts} or a parallel size that divides {size}"
        )
    return size // parts


def require_plain_embedding(emb: object, owner: str) -> None:
    """``ConfigError`` unless ``emb`` is a plain table: ``padding_idx``, ``max_norm`` and ``sparse``
    would make a sharded embedding's gradients differ silently from the unsharded one's."""
    if (
        getattr(emb, "padding_idx", None) is not None
        or getattr(emb, "max_norm", None) is not None
        or getattr(emb, "sparse", False)
    ):
        raise ConfigError(
            f"{owner}.from_embedding supports plain nn.Embedding only (no padding_idx, "
            "max_norm or sparse); mask padding tokens in the loss instead"
        )


@dataclass(frozen=True)
class MeshConfig:
    """Sizes of the data, pipeline, sequence and tensor-parallel axes.

    Attributes:
        dp: data-parallel size (replicas of the model).
        pp: pipeline-parallel size (stages).
        tp: tensor-parallel size (ranks that share one layer); for 2d ``q*q``, 2.5d ``q*q*d``,
            3d ``q**3``.
        tp_mode: how a layer is split across the ``tp`` ranks: "1d", "2d", "2.5d" or "3d".
        tp_depth: the depth ``d`` of 2.5d (number of stacked ``q x q`` layers); 1 otherwise.
        sp: long-sequence parallel size (ranks that share one sequence: ring attention, Ulysses).

    Construction checks only types and the mode name; ``validate(world_size)`` checks the shape
    rules, and ``ProcessMesh`` calls it before it creates any process group.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    tp_mode: TpMode = "1d"
    tp_depth: int = 1
    sp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "tp_depth", "sp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"MeshConfig.{name} must be a positive int, got {value!r}")
        if self.tp_mode not in TP_MODES:
            raise ConfigError(f"MeshConfig.tp_mode must be one of {TP_MODES}, got {self.tp_mode!r}")

    @property
    def tp_axes(self) -> tuple[str, ...]:
        """The tensor-parallel sub-axes of the mode (see [Note: rank layout])."""
        return _TP_AXES[self.tp_mode]

    @property
    def tp_layout(self) -> tuple[str, ...]:
        """The sub-axes in rank-layout order, outermost first; sizes in ``tp_shape``."""
        return _TP_LAYOUT[self.tp_mode]

    @property
    def tp_shape(self) -> tuple[int, ...]:
        """Sizes of ``tp_layout`` (all equal to q except 2.5d's depth d).

        Raises ``ConfigError`` when ``tp`` does not fit the mode.
        """
        self.check_tp()
        if self.tp_mode == "1d":
            return (self.tp,)
        k = 3 if self.tp_mode == "3d" else 2
        q = _int_root(self.tp // self.tp_depth, k)  # tp_depth is 1 except in 2.5d
        assert q is not None  # check_tp() refuses the sizes that have none
        return (self.tp_depth, q, q) if self.tp_mode == "2.5d" else (q,) * k

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis name a mesh of this config answers to, layout axes first."""
        names = ("pp", "dp", "sp", *self.tp_axes)
        names = names if self.tp_mode == "1d" else (*names, "tp")
        # dp and sp flattened (ZeRO and Gemini shard over both when sequences are split)
        return (*names, "dp_sp") if self.sp > 1 else names

    @property
    def world_size(self) -> int:
        """``dp * pp * sp * tp``: the number of ranks this config needs."""
        return self.dp * self.pp * self.sp * self.tp

    def check_tp(self) -> None:
        """``ConfigError`` unless ``tp`` fits the mode's shape (no world size needed)."""
        tp, mode, d = self.tp, self.tp_mode, self.tp_depth
        if mode != "2.5d" and d != 1:
            raise ConfigError(
                f"tp_depth={d} only applies to tp_mode='2.5d' (got tp_mode={mode!r}); "
                "leave tp_depth at 1 or use tp_mode='2.5d'"
            )
        if mode == "2d" and _int_root(tp, 2) is None:
            raise ConfigError(
                f"2d tensor parallelism needs tp = q*q (a square such as 4, 9, 16), got tp={tp}"
            )
        if mode == "2.5d" and (tp % d != 0 or _int_root(tp // d, 2) is None):
            raise ConfigError(
                f"2.5d tensor parallelism needs tp = q*q*d with d = tp_depth = {d}, got tp={tp}; "
                f"for d={d} valid sizes are {[q * q * d for q in range(1, 5)]}"
            )
        if mode == "3d" and _int_root(tp, 3) is None:
            raise ConfigError(
                f"3d tensor parallelism needs tp = q*q*q (a cube such as 8, 27, 64), got tp={tp}"
            )

    def validate(self, world_size: int) -> None:
        """Raise ``ConfigError`` unless the mode's shape rule holds and dp*pp*sp*tp == world_size."""
        self.check_tp()
        if self.world_size != world_size:
            raise ConfigError(
                f"dp*pp*sp*tp = {self.dp}*{self.pp}*{self.sp}*{self.tp} = {self.world_size} "
                "must equal the "
                f"world size {world_size}; change the axis sizes or launch {self.world_size} ranks"
            )

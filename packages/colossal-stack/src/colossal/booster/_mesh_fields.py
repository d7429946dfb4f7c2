"""The mesh settings the hybrid and Gemini plugins share, defined once.

[Note: mesh fields] Tensor parallelism (``tp_size``, ``tp_mode``, ``tp_depth``) and sequence
parallelism (``sequence_parallel``, ``sp_size``) mean the same in both plugins: ``MeshFields``
declares them (keyword-only) and ``check_mesh_fields`` checks what both check first: the sizes
are positive ints, ``tp_mode`` is a known mode that ``tp_size`` fits, and ``sequence_parallel``
is a kind the plugin runs. ``colossal train``'s parallel section holds the same settings under
its flags' names (``--tp``, ``--sp``) and maps them onto these fields in one place
(``ParallelSection.mesh_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_contracts import ConfigError
from colossal_parallel import TP_MODES, MeshConfig, TpMode

__all__ = ["MeshFields"]


@dataclass(kw_only=True)
class MeshFields:
    """The tensor- and sequence-parallel settings of a plugin ([Note: mesh fields]).

    Attributes:
        tp_size: tensor-parallel ranks (1: none).
        tp_mode: how layers split over them: "1d", "2d" (tp_size = q*q), "2.5d"
            (q*q*tp_depth) or "3d" (q**3).
        tp_depth: the depth d of 2.5d tensor parallelism.
        sequence_parallel: None, "ring" or "ulysses" over ``sp_size`` ranks per sequence; the
            hybrid plugin also takes "megatron" (activations split over the 1d tp ranks),
            "ring+megatron" and "ulysses+megatron".
        sp_size: ranks each sequence is split over (ring, Ulysses; 1 otherwise).
    """

    tp_size: int = 1
    tp_mode: TpMode = "1d"
    tp_depth: int = 1
    sequence_parallel: str | None = None
    sp_size: int = 1

    def check_mesh_fields(self, kinds: tuple[str | None, ...]) -> None:
        """``ConfigError`` (one line, naming the plugin's field) unless the sizes are positive
        ints, ``tp_mode`` is known and fits ``tp_size``, and ``sequence_parallel`` is one of
        ``kinds`` (those the plugin runs)."""
        who = type(self).__name__
        for k in ("tp_size", "tp_depth", "sp_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{who}.{k} must be a positive int, got {v!r}")
        if self.tp_mode not in TP_MODES:
            raise ConfigError(f"{who}.tp_mode must be one of {TP_MODES}, got {self.tp_mode!r}")
        if self.sequence_parallel not in kinds:
            raise ConfigError(
                f"{who}.sequence_parallel must be one of {kinds}, got {self.sequence_parallel!r}"
            )
        MeshConfig(tp=self.tp_size, tp_mode=self.tp_mode, tp_depth=self.tp_depth).check_tp()

"""Evoformer configuration: a flat dataclass and named presets, from test sizes to AlphaFold 2's.

Sizes follow the AlphaFold 2 supplement (Jumper et al., 2021, section 1.6 and Algorithms 6-15):
MSA representation ``m`` of shape (S sequences, R residues, c_m), pair representation ``z`` of
shape (R, R, c_z). Dropout is omitted (the supplement's rates are 0.15 and 0.25 during training
only; a deterministic block is what the parallel and chunked paths are checked against), and so
are the MSA and pair masks (every position is real).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from colossal_contracts import ConfigError

__all__ = ["EVOFORMER_PRESETS", "EvoformerConfig"]


@dataclass(frozen=True)
class EvoformerConfig:
    """Shape of an Evoformer stack (AlphaFold 2 supplement, Algorithm 6 per block).

    Attributes:
        num_blocks: Evoformer blocks (48 in AlphaFold 2).
        c_m: MSA channels (256).
        c_z: pair channels (128).
        c_s: single-representation channels of the stack's final projection of the first MSA row
            (384, Algorithm 2 line 17); 0 leaves the projection out.
        msa_heads: heads of MSA row- and column-wise attention (8, Algorithms 7 and 8).
        c_hidden_msa: width of one MSA attention head (32).
        c_hidden_opm: width of the outer product mean's projections (32, Algorithm 10).
        c_hidden_mul: width of the triangular multiplicative updates (128, Algorithms 11 and 12).
        pair_heads: heads of triangular self-attention (4, Algorithms 13 and 14).
        c_hidden_pair: width of one triangular attention head (32).
        transition_n: widening factor of the MSA and pair transitions (4, Algorithms 9 and 15).
        eps: LayerNorm epsilon.
    """

    num_blocks: int = 48
    c_m: int = 256
    c_z: int = 128
    c_s: int = 384
    msa_heads: int = 8
    c_hidden_msa: int = 32
    c_hidden_opm: int = 32
    c_hidden_mul: int = 128
    pair_heads: int = 4
    c_hidden_pair: int = 32
    transition_n: int = 4
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in (
            "num_blocks",
            "c_m",
            "c_z",
            "msa_heads",
            "c_hidden_msa",
            "c_hidden_opm",
            "c_hidden_mul",
            "pair_heads",
            "c_hidden_pair",
            "transition_n",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"EvoformerConfig.{name} must be a positive int, got {value!r}")
        if self.c_s < 0:
            raise ConfigError(
                f"EvoformerConfig.c_s must be >= 0 (0: no projection), got {self.c_s}"
            )

    def block_params(self) -> dict[str, int]:
        """Exact parameter count of each part of one block (LayerNorms with bias; Linear layers
        with bias except the supplement's ``LinearNoBias``: queries, keys, values, pair biases)."""
        cm, cz, n = self.c_m, self.c_z, self.transition_n
        hm, dm = self.msa_heads, self.c_hidden_msa
        hp, dp = self.pair_heads, self.c_hidden_pair
        co, cu = self.c_hidden_opm, self.c_hidden_mul

        def lin(i: int, o: int, bias: bool = True) -> int:
            return i * o + (o if bias else 0)

        def gated_attn(c: int, h: int, d: int) -> int:  # q, k, v, gate, output
            return 3 * lin(c, h * d, False) + lin(c, h * d) + lin(h * d, c)

        def transition(c: int) -> int:
            return 2 * c + lin(c, n * c) + lin(n * c, c)

        return {
            "msa_row_attention": 2 * cm + 2 * cz + lin(cz, hm, False) + gated_attn(cm, hm, dm),
            "msa_column_attention": 2 * cm + gated_attn(cm, hm, dm),
            "msa_transition": transition(cm),
            "outer_product_mean": 2 * cm + 2 * lin(cm, co) + lin(co * co, cz),
            # a, b projections and gates, output gate, output LayerNorm and projection
            "triangle_multiplication": 2 * (2 * cz + 4 * lin(cz, cu) + lin(cz, cz) + 2 * cu)
            + 2 * lin(cu, cz),
            "triangle_attention": 2 * (2 * cz + lin(cz, hp, False) + gated_attn(cz, hp, dp)),
            "pair_transition": transition(cz),
        }

    def num_params(self) -> int:
        """Exact parameter count of ``Evoformer(self)``: blocks plus the single projection."""
        single = self.c_m * self.c_s + self.c_s if self.c_s else 0
        return self.num_blocks * sum(self.block_params().values()) + single

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> EvoformerConfig:
        """The named preset, with fields replaced by ``overrides``; ``ConfigError`` if unknown."""
        if name not in EVOFORMER_PRESETS:
            raise ConfigError(
                f"unknown Evoformer preset {name!r}; choose one of: {', '.join(EVOFORMER_PRESETS)}"
            )
        return replace(EVOFORMER_PRESETS[name], **overrides)


EVOFORMER_PRESETS: dict[str, EvoformerConfig] = {
    # Test sizes: every head count and width above 1, so a wrong reshape cannot hide.
    "tiny": EvoformerConfig(
        num_blocks=2,
        c_m=16,
        c_z=8,
        c_s=16,
        msa_heads=2,
        c_hidden_msa=4,
        c_hidden_opm=4,
        c_hidden_mul=8,
        pair_heads=2,
        c_hidden_pair=4,
        transition_n=2,
    ),
    "small": EvoformerConfig(
        num_blocks=4,
        c_m=64,
        c_z=32,
        c_s=64,
        msa_heads=4,
        c_hidden_msa=16,
        c_hidden_opm=16,
        c_hidden_mul=32,
        pair_heads=4,
        c_hidden_pair=8,
    ),
    # AlphaFold 2's main Evoformer stack (supplement section 1.6, Algorithms 6-15).
    "alphafold2": EvoformerConfig(),
}

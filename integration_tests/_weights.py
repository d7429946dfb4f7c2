"""Comparing trained GPT weights against plain AdamW's, shared by the Gemini integration tests."""

from __future__ import annotations

import torch


def _split_key_bias(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(query and value thirds, key third) of a fused (query, key, value) bias."""
    c = b.numel() // 3
    return torch.cat([b[:c], b[2 * c :]]), b[c : 2 * c]


def assert_weights_close(
    weights: dict[str, torch.Tensor],
    ref_weights: dict[str, torch.Tensor],
    rel: float,
    *,
    key_atol: float | None = None,
    key_bias: tuple[str, ...] = ("attn.qkv.bias",),
    label: str = "",
) -> None:
    """Every tensor of ``ref_weights`` within relative norm ``rel`` of ``weights``. The key third
    of each fused qkv bias (names ending in ``key_bias``) is left out: its true gradient is zero
    (softmax is invariant to a per-query shift), and Adam normalises whatever rounding noise each
    run leaves there into full-size steps. With ``key_atol`` that third is compared absolutely
    (largest element difference) instead. ``label`` prefixes failure messages."""
    for k, ref in ref_weights.items():
        got = weights[k]
        if k.endswith(key_bias):
            (got, key_got), (ref, key_ref) = _split_key_bias(got), _split_key_bias(ref)
            if key_atol is not None:
                err = float((key_got - key_ref).abs().max())
                assert err <= key_atol, f"{label}{k}: key third differs by {err:.2e}"
        err = float((got - ref).norm() / ref.norm())
        assert err <= rel, f"{label}{k}: differs by {err:.2e} (relative norm)"

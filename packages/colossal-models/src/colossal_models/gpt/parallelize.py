"""Tensor-parallel plan of ``GPT``: which layer is sharded how (the how is in ``_tp``).

Per block: ``attn.qkv`` and ``mlp.fc`` are column projections (``qkv`` rows first interleaved per
rank, [Note: fused projections]); ``attn.proj`` and ``mlp.proj`` are row projections; ``ln1``,
``ln2`` and ``ln_f`` are norms. ``wte`` is the token embedding, tied to the head through
``io``; ``wpe`` the position table. Activation checkpointing is a per-block flag, set first.
"""

from __future__ import annotations

from colossal_parallel import ProcessMesh

from .._checkpointing import apply_activation_checkpointing
from .._tp import build_layers, interleave_rows
from .model import GPT

__all__ = ["parallelize_gpt"]


def parallelize_gpt(
    model: GPT,
    mesh: ProcessMesh,
    mode: str | None = None,
    *,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
) -> GPT:
    """Shard ``model`` in place for ``mesh``'s tensor-parallel ``mode``; returns it.

    Every rank must pass the same unsharded model (same seed); each keeps its shard. The sharded
    model takes the full ``(B, T)`` ids on every rank and returns the same loss everywhere.
    """
    layers = build_layers(mesh, mode, sequence_parallel=sequence_parallel)
    cfg = model.config
    layers.check_heads(cfg.num_heads, "GPT attention")
    apply_activation_checkpointing(model, enabled=activation_checkpointing)
    for block in model.blocks:
        qkv = interleave_rows(block.attn.qkv, 3, layers.head_parts)
        block.attn.qkv = layers.column(qkv)
        block.attn.proj = layers.row(block.attn.proj)
        block.mlp.fc = layers.column(block.mlp.fc)
        block.mlp.proj = layers.row(block.mlp.proj)
        block.ln1 = layers.norm(block.ln1)
        block.ln2 = layers.norm(block.ln2)
    model.ln_f = layers.norm(model.ln_f)
    model.wte = layers.token_embedding(model.wte, positions_follow=True)
    model.wpe = layers.position_embedding(model.wpe)
    model.io = layers.io(head=None, positions_follow=True)
    return model

"""Tensor-parallel plan of ``PaLM``: which layer is sharded how (the how is in ``_tp``).

Per block: ``attn.q``, ``mlp.gate`` and ``mlp.up`` are column projections; ``attn.k`` and
``attn.v`` are key/value projections (split when there are at least as many key/value heads as
ranks, else gathered, [Note: shared key/value heads]); ``attn.proj`` and ``mlp.proj`` are row
projections; ``ln1`` (and ``ln2``) and ``ln_f`` are norms. ``wte`` is the token embedding, the
head when tied; an untied ``lm_head`` becomes a vocabulary-parallel head used through ``io``.
"""

from __future__ import annotations

from colossal_parallel import ProcessMesh

from .._checkpointing import apply_activation_checkpointing
from .._tp import build_layers
from .model import PaLM

__all__ = ["parallelize_palm"]


def parallelize_palm(
    model: PaLM,
    mesh: ProcessMesh,
    mode: str | None = None,
    *,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
) -> PaLM:
    """Shard ``model`` in place for ``mesh``'s tensor-parallel ``mode``; returns it.

    Every rank must pass the same unsharded model (same seed); each keeps its shard. The sharded
    model takes the full ``(B, T)`` ids on every rank and returns the same loss everywhere.
    """
    layers = build_layers(mesh, mode, sequence_parallel=sequence_parallel)
    cfg = model.config
    layers.check_heads(cfg.num_heads, "PaLM attention")
    apply_activation_checkpointing(model, enabled=activation_checkpointing)
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        attn.q = layers.column(attn.q)
        attn.k = layers.kv(attn.k, cfg.num_heads, cfg.num_kv_heads)
        attn.v = layers.kv(attn.v, cfg.num_heads, cfg.num_kv_heads)
        attn.proj = layers.row(attn.proj)
        mlp.gate = layers.column(mlp.gate)
        mlp.up = layers.column(mlp.up)
        mlp.proj = layers.row(mlp.proj)
        block.ln1 = layers.norm(block.ln1)
        if block.ln2 is not None:
            block.ln2 = layers.norm(block.ln2)
    model.ln_f = layers.norm(model.ln_f)
    model.wte = layers.token_embedding(model.wte, positions_follow=False)
    if model.lm_head is not None:
        model.lm_head = layers.output_head(model.lm_head)
    model.io = layers.io(head=model.lm_head, positions_follow=False)
    return model

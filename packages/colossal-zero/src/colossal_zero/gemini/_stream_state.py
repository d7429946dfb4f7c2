"""``iter_full_state``: a Gemini model's full fp32 state, one chunk gathered at a time."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ._module import GeminiModule, gather_shard

__all__ = ["iter_full_state"]


@torch.no_grad()
def iter_full_state(model: GeminiModule) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter (fp32: the masters when they exist; tied names
    each once, with the same values) and then every buffer, full and on the CPU, as
    ``full_state_dict`` has them. Collective over the data-parallel group: every rank iterates
    to the end. Invariant: one chunk is gathered at a time; each tensor is a view of it, valid
    until the next chunk is gathered, so a consumer that writes (or copies) each tensor before
    asking for the next holds one chunk, never the model."""
    rt = model.runtime
    names: dict[str, list[str]] = {}
    for alias, canon in rt.aliases.items():
        names.setdefault(canon, []).append(alias)
    for c in (g.param for g in rt.manager.groups.values()):
        src = rt.roles.fp32(c)
        full = gather_shard(src.payload, rt.group)
        for name, rec in c.records.items():
            for alias in names.get(name, ()):
                value = full[rec.offset : rec.end].view(rec.shape)
                yield alias, value.to(torch.promote_types(value.dtype, torch.float32))
        del full
        rt.manager.shard_io.read_done(
            [src]
        )  # a shard on disk was only read: its pages leave memory
    for n, b in model.module.named_buffers():
        yield n, b.detach().cpu()

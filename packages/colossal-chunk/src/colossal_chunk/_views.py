"""The registered parameters and their views into chunk storage.

[Note: parameter views] After ``register``, every parameter's ``.data`` is a view into its chunk:
into the gathered buffer when the chunk is gathered (always, with one rank), else an empty tensor.
Whenever a payload moves or is gathered/released, the views are re-pointed, so code that holds the
``nn.Parameter`` object always sees the current storage. Never keep ``param.data`` across an access.

[Note: views bound once] Re-pointing costs a view and a ``.data`` assignment per parameter, and an
access asks for it after every move and gather, mostly of storage that did not change (a chunk
already gathered, a frozen chunk read again). So a chunk remembers what its views point at
(``Chunk.bound``: a weak reference to the gathered buffer, or the device of the empty
placeholders) and ``bind`` does nothing while that is still current. A weak reference: a
buffer freed and another made at the same address is a different object, so it is re-bound.
Anything that sets ``param.data`` itself must do it before ``register`` (new chunks bind anew).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from colossal_contracts import ChunkStateError, ConfigError

from ._chunk import Chunk

__all__ = ["ParamViews"]

Tensorish = torch.Tensor | str


class ParamViews:
    """Registered parameters by name, and which parameter chunk holds each; ``bind`` re-points
    a chunk's views. The chunk manager owns one (a re-pack ``clear``s it and registers anew)."""

    params: dict[str, nn.Parameter]  # name -> parameter
    name_of: dict[int, str]  # id(parameter) -> name
    chunk_of: dict[str, int]  # name -> parameter chunk id

    def __init__(self) -> None:
        self.params, self.name_of, self.chunk_of = {}, {}, {}

    def add(self, name: str, param: nn.Parameter, chunk_id: int) -> None:
        self.params[name], self.name_of[id(param)] = param, name
        self.chunk_of[name] = chunk_id

    def knows(self, name: str, param: nn.Parameter) -> bool:
        """True if ``param`` or ``name`` is registered already (a tied weight, a repeat)."""
        return id(param) in self.name_of or name in self.params

    def clear(self) -> None:
        self.params, self.name_of, self.chunk_of = {}, {}, {}

    def name(self, item: Tensorish) -> str:
        """The registered name of ``item`` (a parameter or its name); ``ConfigError`` if none."""
        if isinstance(item, str):
            if item not in self.params:
                raise ConfigError(f"no registered parameter is named {item!r}; register it first")
            return item
        name = self.name_of.get(id(item))
        if name is None:
            raise ConfigError(
                f"a tensor of shape {tuple(item.shape)} is not a registered parameter; pass the "
                "nn.Parameter objects given to register() (or their names)"
            )
        return name

    def bind(self, chunk: Chunk) -> None:
        """Re-point the ``.data`` of ``chunk``'s parameters ([Note: parameter views]) unless they
        already point at its current storage ([Note: views bound once])."""
        if chunk.kind != "param":
            return
        full, bound = chunk.full, chunk.bound
        if full is not None:
            if isinstance(bound, weakref.ref) and bound() is full:
                return
            for name in chunk.records:
                self.params[name].data = chunk.view(name)
            chunk.bound = weakref.ref(full)
            return
        shard = chunk.shard
        if shard is None:
            raise ChunkStateError(f"chunk {chunk.chunk_id} has no shard storage yet")
        if bound == shard.device:
            return
        for name in chunk.records:
            self.params[name].data = torch.empty(0, dtype=chunk.dtype, device=shard.device)
        chunk.bound = shard.device

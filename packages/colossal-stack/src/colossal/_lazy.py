"""``colossal.lazy_init()``: build a model without memory, materialize it into Gemini's chunks."""

from __future__ import annotations

from colossal_zero import LazyInit

__all__ = ["lazy_init"]


def lazy_init() -> LazyInit:
    """A context in which models are built on the meta device, recording how to fill them.

    ``with colossal.lazy_init() as lazy: model = GPT(cfg)``; then
    ``GeminiPlugin(..., lazy=lazy)`` materializes the parameters chunk by chunk directly in their
    tier, with the values eager construction gives under the same seed (colossal-zero's
    [Note: lazy init]).
    """
    return LazyInit()

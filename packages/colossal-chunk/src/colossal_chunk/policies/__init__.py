"""Placement policies: pure functions of a ``PolicyContext`` that return chunk ids (``Placement``
does the moves), so that ``simulate`` can replay any of them against Belady's MIN on a traced
compute order (``trace_order``). ``AutoPolicy`` and ``StaticPolicy``, the two a manager is
usually given, are re-exported by ``colossal_chunk``; what writes or replays a policy is here."""

from .._order import trace_order
from ._base import ChunkSummary, LruPolicy, PolicyContext
from ._simulate import simulate, simulate_policy

__all__ = [
    "ChunkSummary",
    "LruPolicy",
    "PolicyContext",
    "simulate",
    "simulate_policy",
    "trace_order",
]

"""Where model data comes from: a tiny Protocol any memory manager can satisfy."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from colossal_contracts import TierName

__all__ = ["ModelDataSource"]


@runtime_checkable
class ModelDataSource(Protocol):
    """Anything that knows how many bytes of model data (parameters, gradients, optimizer states)
    it holds on each tier, e.g. a chunk manager. Called at every allocation while tracing, so it
    must be cheap (a counter read) and must not run torch operators.
    """

    def model_data_bytes(self, tier: TierName) -> int:
        """Bytes of model data held on ``tier`` now."""
        ...

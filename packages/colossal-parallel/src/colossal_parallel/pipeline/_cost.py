"""Bytes a pipeline stage sends per training step (``run_pipeline``'s counted ``send`` bytes)."""

from __future__ import annotations

__all__ = ["pipeline_p2p_bytes"]


def pipeline_p2p_bytes(
    stage: int, num_stages: int, num_microbatches: int, boundary_numel: int, elem_bytes: int = 4
) -> int:
    """Bytes ``stage`` sends in one step of any schedule without virtual chunks: each micro-batch's
    boundary activation forward (all but the last stage) and its gradient backward (all but the
    first); ``boundary_numel`` is one micro-batch's ``b * s * h``."""
    sends = (stage < num_stages - 1) + (stage > 0)
    return sends * num_microbatches * boundary_numel * elem_bytes

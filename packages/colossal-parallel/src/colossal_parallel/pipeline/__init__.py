"""Pipeline parallelism over the mesh's ``pp`` axis: layer partitioning, the schedules (GPipe,
1F1B, interleaved, zero-bubble) with their simulator, and the runtime that executes one rank's
schedule exchanging activations point to point."""

from ._cost import pipeline_p2p_bytes
from ._forward import run_pipeline_forward
from ._partition import parameter_costs, partition_layers, stage_rank
from ._runtime import PipelineResult, run_pipeline
from ._schedule import (
    SCHEDULES,
    Action,
    PipelineSchedule,
    ScheduleKind,
    ideal_idle_fraction,
    idle_fractions,
    simulate,
)

__all__ = [
    "SCHEDULES",
    "Action",
    "PipelineResult",
    "PipelineSchedule",
    "ScheduleKind",
    "ideal_idle_fraction",
    "idle_fractions",
    "parameter_costs",
    "partition_layers",
    "pipeline_p2p_bytes",
    "run_pipeline",
    "run_pipeline_forward",
    "simulate",
    "stage_rank",
]

"""colossal-memtrace: know where every byte goes while a model trains.

Probes (host, CUDA + NVML, live tensors), tracers (sampling, hooks), ``MemStats`` (satisfies
``colossal_contracts.MemStatsSource``), a static meta-device estimate, and reports.
"""

from ._cuda import CudaProbe
from ._estimate import estimate_step, run_step, trace_step
from ._hooks import HookTracer, TraceConfig
from ._host import HostProbe
from ._live import LiveTensorProbe, LiveTensorTracker
from ._moments import MomentRecorder
from ._profile import ProfileRequest, profile_step
from ._report import plot_timeline, print_report, stats_table
from ._sampler import SamplingTracer
from ._sources import ModelDataSource
from ._stats import MemStats

__version__ = "0.1.0"

__all__ = [
    "CudaProbe",
    "HookTracer",
    "HostProbe",
    "LiveTensorProbe",
    "LiveTensorTracker",
    "MemStats",
    "ModelDataSource",
    "MomentRecorder",
    "ProfileRequest",
    "SamplingTracer",
    "TraceConfig",
    "estimate_step",
    "plot_timeline",
    "print_report",
    "profile_step",
    "run_step",
    "stats_table",
    "trace_step",
]

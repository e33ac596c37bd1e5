"""latencylab: find where inference time goes, cut it, keep P99 inside its budget."""

from __future__ import annotations

from latencylab.analysis import ProfileAnalysis, analyze
from latencylab.clock import Clock, CudaEventClock, FakeClock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline, Stage
from latencylab.profiler import ProfileConfig, profile
from latencylab.results import ProfileResult, load_result

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "CudaEventClock",
    "FakeClock",
    "LatencyLabError",
    "PerfCounterClock",
    "Pipeline",
    "ProfileAnalysis",
    "ProfileConfig",
    "ProfileResult",
    "Stage",
    "__version__",
    "analyze",
    "load_result",
    "profile",
]

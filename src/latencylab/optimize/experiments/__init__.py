"""Pipeline-level optimisation experiments: change how the pipeline runs, not the model's weights.

Four measurements, each interleaved (the variants take turns in rounds, A B, B A, ..., in one process, so
machine drift hits them alike) and summarised with :func:`latencylab.stats.summarize` (percentile
bootstrap CIs):

* :func:`shape_policy` (text): pad every input to a fixed maximum, pad exactly (to the longest of the
  batch), or pad to a few length buckets (:func:`choose_buckets`). Reports latency per item, padded
  tokens per real token and whether the embeddings stay equal to the exact policy's.
* :func:`pipeline_overlap` (vision): serial decode -> preprocess -> forward per input against a
  double-buffered data path (a producer thread prepares input i+1 while the model runs input i, through a
  bounded queue). Reports throughput and per-item latency.
* :func:`thread_sweep` and :func:`batch_sweep`: per-item latency and throughput per setting;
  :func:`non_monotonic` flags batch sizes that are slower per item than a smaller batch.

One module per experiment (``shapes``, ``overlap``, ``sweeps``), each with its config dataclass; every
function returns a frozen result with ``to_dict()`` (JSON-serialisable, raw samples included, the derived
statistics beside them; read back as :class:`latencylab.results.experiment.ExperimentResult`).
``latencylab experiment`` (:mod:`.frontend`; ``python -m latencylab.optimize.experiments`` is an alias) runs
them all on the built-in workloads and prints the tables. Bucketing lives in :mod:`latencylab.optimize.buckets`,
the interleaved timing harness in :mod:`latencylab.timing`.

Timing uses a :class:`~latencylab.clock.Clock` (``perf_counter_ns`` by default; tests inject a
:class:`~latencylab.clock.FakeClock` and get exact numbers).
"""

from __future__ import annotations

from latencylab.optimize.buckets import BUCKET_METHODS, bucket_for, choose_buckets, padding_waste
from latencylab.optimize.experiments.glue import text_forward_fn, vision_forward_fn, vision_stages
from latencylab.optimize.experiments.overlap import (
    OverlapConfig,
    OverlapMode,
    OverlapResult,
    format_overlap,
    pipeline_overlap,
)
from latencylab.optimize.experiments.shapes import (
    PolicyOutcome,
    ShapePolicyConfig,
    ShapePolicyResult,
    format_shape,
    shape_policy,
)
from latencylab.optimize.experiments.sweeps import (
    BatchSweepConfig,
    SweepPoint,
    SweepResult,
    ThreadSweepConfig,
    batch_sweep,
    format_sweep,
    non_monotonic,
    thread_sweep,
)
from latencylab.timing import Arm, VariantTiming, interleave

__all__ = [
    "BUCKET_METHODS",
    "Arm",
    "BatchSweepConfig",
    "OverlapConfig",
    "OverlapMode",
    "OverlapResult",
    "PolicyOutcome",
    "ShapePolicyConfig",
    "ShapePolicyResult",
    "SweepPoint",
    "SweepResult",
    "ThreadSweepConfig",
    "VariantTiming",
    "batch_sweep",
    "bucket_for",
    "choose_buckets",
    "format_overlap",
    "format_shape",
    "format_sweep",
    "interleave",
    "non_monotonic",
    "padding_waste",
    "pipeline_overlap",
    "shape_policy",
    "text_forward_fn",
    "thread_sweep",
    "vision_forward_fn",
    "vision_stages",
]

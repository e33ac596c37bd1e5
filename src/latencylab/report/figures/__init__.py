"""The report's figures: matplotlib on the Agg canvas, returned as inline PNG ``data:`` URIs.

Every function takes a result (or its JSON document) and returns ``data:image/png;base64,...`` that an
``<img>`` shows without any file or network access. One module per figure family: :mod:`.profile`,
:mod:`.load` (the load-run figures are drawn by :mod:`latencylab.load.plots`, the same as
``latencylab load --plot`` writes), :mod:`.pareto` (optimize), :mod:`.gen_pareto` (optimize-gen),
:mod:`.ladder` (serve), :mod:`.tokens` (generative load); what they share
is in :mod:`.common` and :mod:`latencylab.plotting`. Latencies are in milliseconds; log axes wherever a
tail is 10x the median. matplotlib is optional (``pip install 'latencylab[plot]'``): a missing one is a
one-line :class:`~latencylab.errors.LatencyLabError`.
"""

from __future__ import annotations

from latencylab.report.figures.common import DEADLINE, DPI, finite, to_data_uri
from latencylab.report.figures.gen_pareto import gen_speedup_fidelity
from latencylab.report.figures.ladder import ladder_over_time
from latencylab.report.figures.load import (
    ThroughputPoint,
    capacity_curve,
    latency_vs_throughput,
    load_cdf,
    load_histogram,
    load_over_time,
    server_breakdown,
)
from latencylab.report.figures.pareto import FidelityLoss, fidelity_loss, fidelity_score, pareto_figure, pareto_front
from latencylab.report.figures.profile import profile_breakdown, profile_distribution, profile_over_time, stage_shares
from latencylab.report.figures.tokens import has_tokens, token_cdf, token_over_time

__all__ = [
    "DEADLINE",
    "DPI",
    "FidelityLoss",
    "ThroughputPoint",
    "capacity_curve",
    "fidelity_loss",
    "fidelity_score",
    "finite",
    "gen_speedup_fidelity",
    "has_tokens",
    "ladder_over_time",
    "latency_vs_throughput",
    "load_cdf",
    "load_histogram",
    "load_over_time",
    "pareto_figure",
    "pareto_front",
    "profile_breakdown",
    "profile_distribution",
    "profile_over_time",
    "server_breakdown",
    "stage_shares",
    "to_data_uri",
    "token_cdf",
    "token_over_time",
]

"""A/A false-positive rate of latencylab compare on synthetic samples (raw or HDR-binned).

.venv/bin/python benchmarks/compare_fpr.py 200 2000 [hist]
"""

import sys

import numpy as np

from latencylab.compare.model import LATENCY_METRICS
from latencylab.compare.series import compare_series
from latencylab.compare.stats import Binned
from latencylab.histogram import LatencyHistogram

reps, n = int(sys.argv[1]), int(sys.argv[2])
hist = len(sys.argv) > 3 and sys.argv[3] == "hist"
rng = np.random.default_rng(12345)
sig = dict.fromkeys(LATENCY_METRICS, 0)
rank = anyflag = 0


def binned(x):
    if not hist:
        return Binned.from_samples(x)
    h = LatencyHistogram(lowest_ns=1)
    h.record_many(x)
    return Binned.from_cdf(h.cdf(), h.count)


for i in range(reps):
    a = 1e6 + 3e6 * rng.lognormal(0, 0.25, n)
    b = 1e6 + 3e6 * rng.lognormal(0, 0.25, n)
    s = compare_series("e2e", binned(a), binned(b), seed=i)
    for m in s.metrics:
        sig[m.metric] += m.significant
    rank += s.rank.p_value < 0.05
    anyflag += any(m.flagged for m in s.metrics if m.metric in ("p50", "p90", "p99", "mean"))
print("significant:", {k: v / reps for k, v in sig.items()})
print("mann-whitney:", rank / reps, " any of p50/p90/p99/mean flagged:", anyflag / reps)

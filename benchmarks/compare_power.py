"""A/A false-positive rate and power of latencylab compare (docs/benchmarks/compare.md)."""

import math
import sys
import time

import numpy as np

from latencylab.compare import stats as cs
from latencylab.compare.series import compare_series
from latencylab.histogram import LatencyHistogram

REPS, N = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(12345)
draw = lambda n, scale=1.0: scale * (1e6 + 3e6 * rng.lognormal(0.0, 0.25, n))  # noqa: E731


def hdr(x):
    h = LatencyHistogram(lowest_ns=1)
    h.record_many(x)
    return cs.Binned.from_cdf(h.cdf(), h.count)


def rates(kind, scale):
    keys = ("p50", "p90", "p99", "mean", "max")
    hits = dict.fromkeys((*keys, "rank", "any flagged"), 0)
    for i in range(REPS):
        a, b = draw(N), draw(N, scale)
        wrap = hdr if kind == "hdr" else cs.Binned.from_samples
        s = compare_series("e2e", wrap(a), wrap(b), seed=i)
        for k in keys:
            hits[k] += s.metric(k).significant
        hits["rank"] += s.rank.p_value < 0.05
        hits["any flagged"] += any(s.metric(k).flagged for k in keys[:4])
    return " ".join(f"{k}={v / REPS:.3f}" for k, v in hits.items())


def ar1(n, phi):
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi**2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return 3e6 * (1 + 0.02 * x)


t = time.time()
print(f"REPS={REPS} N={N} alpha=0.05 B=1000")
print("A/A raw samples:     ", rates("raw", 1.0))
print("A/A HDR histograms:  ", rates("hdr", 1.0))
print("+10% raw samples:    ", rates("raw", 1.10))
print("+2% raw samples:     ", rates("raw", 1.02))
for phi in (0.5, 0.9):
    iid = blk = 0
    blocks = []
    for i in range(REPS):
        a, b = ar1(N, phi), ar1(N, phi)
        ba, bb = cs.Binned.from_samples(a, ordered=True), cs.Binned.from_samples(b, ordered=True)
        blocks.append(ba.block)
        blk += cs.bootstrap_deltas(ba, bb, [0.5], seed=i)[0].significant
        iid += cs.bootstrap_deltas(cs.Binned.from_samples(a), cs.Binned.from_samples(b), [0.5], seed=i)[0].significant
    print(
        f"A/A AR(1) phi={phi}: p50 significant iid={iid / REPS:.3f} block={blk / REPS:.3f} "
        f"(median block {int(np.median(blocks))}, true tau {(1 + phi) / (1 - phi):.0f})"
    )
print(f"({time.time() - t:.0f} s)")

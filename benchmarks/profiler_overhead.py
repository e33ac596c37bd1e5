"""Overhead of the stage profiler, side by side with hand-written perf_counter instrumentation.

Runs in one process, interleaved (A B A B ...) so machine drift hits all variants:

* bare:      the stages called in a loop, nothing timed (the floor)
* by hand:   the seeds' method, ``t = time.perf_counter_ns()`` around each stage, appended to lists
* latencylab: ``latencylab.profile`` with the default clock

and prints, per stage and iteration, the wall time each adds over ``bare`` and
what a no-op stage *reads as* in latencylab's samples (its measurement floor).

    .venv/bin/python benchmarks/profiler_overhead.py [--stages 1 4 16] [--iterations 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from latencylab import Pipeline, ProfileConfig, profile


def noop(x: object) -> object:
    return x


def bare(fns: list[Callable[[object], object]], n: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(n):
        x: object = i
        for fn in fns:
            x = fn(x)
    return time.perf_counter_ns() - t0


def by_hand(fns: list[Callable[[object], object]], n: int) -> float:
    k = len(fns)
    samples: list[list[int]] = [[] for _ in range(k)]
    clock = time.perf_counter_ns
    t0 = clock()
    for i in range(n):
        x: object = i
        t = clock()
        for j in range(k):
            x = fns[j](x)
            t2 = clock()
            samples[j].append(t2 - t)
            t = t2
    return clock() - t0


def with_latencylab(fns: list[Callable[[object], object]], n: int) -> tuple[float, float]:
    pipe = Pipeline("noop", source=lambda i: i)
    for j, fn in enumerate(fns):
        pipe.stage(f"s{j}", fn)
    t0 = time.perf_counter_ns()
    res = profile(pipe, ProfileConfig(warmup=0, iterations=n), env={})
    wall = time.perf_counter_ns() - t0
    reads = float(np.median(np.concatenate([s.array() for s in res.stages])))
    return wall, reads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--iterations", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    clock_res = np.diff([time.perf_counter_ns() for _ in range(100_001)])
    med, p99 = np.median(clock_res), np.quantile(clock_res, 0.99)
    print(f"perf_counter_ns back-to-back: median {med:.0f} ns, p99 {p99:.0f} ns")
    print(
        f"{'stages':>6} {'noop call':>10} {'reads as':>9} {'inflation':>10} "
        f"{'by hand +wall':>14} {'latencylab +wall':>17} {'ratio':>6}"
    )
    for k in args.stages:
        fns = [noop] * k
        n = args.iterations // k
        call, hand, ours, reads = [], [], [], []
        for _ in range(args.rounds):
            b = bare(fns, n)
            call.append(b / (n * k))
            hand.append((by_hand(fns, n) - b) / (n * k))
            b = bare(fns, n)
            wall, r = with_latencylab(fns, n)
            ours.append((wall - b) / (n * k))
            reads.append(r)
        c, h, o, r = (statistics.median(v) for v in (call, hand, ours, reads))
        print(f"{k:>6} {c:>7.0f} ns {r:>6.0f} ns {r - c:>7.0f} ns {h:>11.0f} ns {o:>14.0f} ns {o / h:>6.2f}")
    print("reads as  = median sample latencylab records for a stage that does nothing (its measurement floor)")
    print("inflation = reads as - the cost of the no-op call itself: what the profiler adds to each reading")
    print("+wall     = wall time added per stage per iteration over the bare loop, whole profile() included")
    print("            (source call, resolve, stopping rule, and building the result afterwards)")


if __name__ == "__main__":
    main()

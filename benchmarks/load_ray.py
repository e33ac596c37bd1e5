"""Distributed load generation on Ray (issue 20): 1 vs 2 generator workers, and the driver's merge cost.

``rate`` (default): the highest valid open-loop rate of 1 worker and of 2 workers against one null endpoint.

* Endpoint: Debian's nginx answering the OIP infer path from memory (benchmarks/peers/nginx_null.conf, as in
  load_vs_locust.py), one worker process pinned to ``--server-core``; its core's busy share is printed.
* Cluster: a local 2-node Ray cluster (``ray.cluster_utils.Cluster``), started here.
  Worker i is pinned to core ``--cores[i]``: 1 worker on core 1; 2 workers on cores 0 and 1. This machine
  has 2 vCPUs, so the second worker shares core 0 with nginx (and with the Ray daemons): the 2-worker
  figure is what 2 vCPUs allow, not what 2 dedicated cores would.
* Arrivals: Poisson at R (independent Poisson streams of R/2 with 2 workers: each draws only its own).
* A rate passes when the merged run is valid (every worker sent 99% of its requests within 1 ms of their
  intended times), its lateness p99 <= 1 ms, and nothing failed or was shed. Bracket by doubling from
  ``--start-rate``, then bisect to ``--precision``; a failing rate is retried up to ``--tries`` times (a VM
  can lose a vCPU for several ms, which fails any lateness rule at any rate). Rounds interleave 1 and 2.

``merge-cost``: what the driver pays per worker, measured here, for the 10- and 100-node estimates of
docs/scale.md: building a part from N requests (the worker's end of run), its size on the wire, and
``merge_summary`` over W parts (decode + merge of every histogram and timeline second).

    apt-get install -y nginx-light                     # once: the null endpoint
    /tmp/lbench .venv/bin/python benchmarks/load_ray.py rate [--rounds 2] [--duration 4]
    /tmp/lbench .venv/bin/python benchmarks/load_ray.py merge-cost
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from _serving import core_ticks
from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig, Records, RunStats
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import summarize_run
from load_vs_locust import MODEL, nginx_null


def passes(s: dict[str, Any]) -> tuple[bool, str]:
    late = s.get("lateness_p99_ms")
    if not s.get("valid"):
        return False, "; ".join(s.get("invalid_reasons", []))[:160]
    if late is None or late > 1.0:
        return False, f"lateness p99 {late} ms > 1 ms"
    if s.get("shed") or s.get("error"):
        return False, f"{s.get('shed')} shed, {s.get('error')} failed"
    return True, f"lateness p99 {late:.2f} ms"


def highest_rate(lc: Any, url: str, payloads: list, args: argparse.Namespace, label: str) -> float | None:
    path = infer_path(MODEL)
    cfg = LoadConfig(duration_s=args.duration, connections=32, timeout_s=5.0)
    seed = 0

    def step(rate: float) -> bool:
        nonlocal seed
        for attempt in range(args.tries):
            seed += 1
            b0, t0 = core_ticks(args.server_core)
            run = lc.run(url, path, payloads, Poisson(rate, seed), cfg, seed=seed, env={})
            b1, t1 = core_ticks(args.server_core)
            s = run.result.summary
            ok, why = passes(s)
            busy = 100 * (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            per = ", ".join(f"w{r['worker']} {r['late_fraction']:.1%} late" for r in s["workers"])
            print(
                f"  {label}  {rate:>8,.0f}/s  try {attempt + 1}: {'pass' if ok else 'FAIL'}  achieved "
                f"{s['achieved_rate'] or 0:,.0f}/s  lateness p99 {s['lateness_p99_ms'] or 0:.2f} ms  ({per})  "
                f"server core {busy:.0f}% busy  {'' if ok else why}",
                flush=True,
            )
            if ok:
                return True
        return False

    lo: float | None = None
    hi: float | None = None
    rate = args.start_rate
    while lo is None or hi is None:  # bracket: double while passing, halve while failing
        if step(rate):
            lo = rate
            if hi is None and rate * 2 > args.max_rate:
                return lo
            rate *= 2
        else:
            hi = rate
            if lo is None and rate / 2 < args.start_rate / 16:
                return None
            rate /= 2
        if lo is not None and hi is not None and hi < lo:
            hi = None  # a late failure below a pass (noise): keep doubling from the pass
    while hi / lo - 1 > args.precision:
        mid = (lo + hi) / 2
        if step(mid):
            lo = mid
        else:
            hi = mid
    return lo


def cmd_rate(args: argparse.Namespace) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from latencylab.scaleout.load_ray import LoadCluster

    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise SystemExit("nginx not found: apt-get install -y nginx-light")
    print(f"# load_ray rate  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {platform.node()}  cpus {os.cpu_count()}")
    print(f"# duration {args.duration} s per step, tries {args.tries}, precision {args.precision:.0%}")
    # two logical CPUs per node: the 1-worker and the 2-worker clusters' three actors all fit (the cores they
    # run on are set by pinning, not by Ray's accounting)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    results: dict[int, list[float | None]] = {1: [], 2: []}
    try:
        with nginx_null(nginx, args.server_core) as (url, _worker):
            payloads = payloads_for_model(fetch_metadata(url, MODEL), n=1, seed=0)
            clusters = {
                1: LoadCluster(1, poll_s=1.0, pin_cores=[args.cores[1]]),
                2: LoadCluster(2, poll_s=1.0, pin_cores=args.cores[:2]),
            }
            for lc in clusters.values():
                lc.open()
            try:
                for r in range(args.rounds):
                    for n in (1, 2):
                        print(f"round {r + 1}, {n} worker(s) on core(s) {clusters[n].pin_cores}", flush=True)
                        results[n].append(highest_rate(clusters[n], url, payloads, args, f"{n}w"))
            finally:
                for lc in clusters.values():
                    lc.close()
    finally:
        ray.shutdown()
        c.shutdown()
    print("\n| workers | cores | highest valid rate per round | median |")
    print("|---|---|---|---|")
    med: dict[int, float | None] = {}
    for n in (1, 2):
        got = [x for x in results[n] if x is not None]
        med[n] = statistics.median(got) if got else None
        rounds = ", ".join("-" if x is None else f"{x:,.0f}/s" for x in results[n])
        cores = args.cores[1:2] if n == 1 else args.cores[:2]
        print(f"| {n} | {cores} | {rounds} | {'-' if med[n] is None else f'{med[n]:,.0f}/s'} |")
    if med[1] and med[2]:
        ratio = med[2] / med[1]
        print(f"\nratio 2 workers / 1 worker (medians): {ratio:.2f}x (issue: about 2x with a core each)")
    return 0


def _part_inputs(n: int, seconds: int, seed: int) -> tuple[Records, RunStats]:
    rng = np.random.default_rng(seed)
    intended = np.sort(rng.uniform(0, seconds * 1e9, n)).astype(np.int64)
    sent = intended + rng.integers(0, 300_000, n)
    done = sent + rng.lognormal(np.log(5e6), 0.8, n).astype(np.int64)
    outcome = np.zeros(n, np.int8)
    rec = Records(intended, sent, done, outcome, np.full(n, 200, np.int16), np.zeros(n, np.int32), {}, [])
    run = RunStats(wall_s=seconds, send_span_s=seconds, cpu_s=1.0, connections_opened=8, max_in_flight=8)
    return rec, run


def cmd_merge_cost(args: argparse.Namespace) -> int:
    from latencylab.scaleout.merge import merge_summary, part_from_records

    print(f"# load_ray merge-cost  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {platform.node()}  cpus {os.cpu_count()}")
    cfg = LoadConfig(duration_s=float(args.seconds))
    print(f"\n## a worker's part: {args.seconds}-s run (timeline of {args.seconds} one-second histograms)")
    print("| requests | build part (worker, end of run) | pickled size | summarize_run (worker's own summary) |")
    print("|---|---|---|---|")
    parts = {}
    for n in (10_000, 100_000, 1_000_000):
        rec, run = _part_inputs(n, args.seconds, 1)
        t = time.perf_counter()
        part = part_from_records(0, "node", rec, 50e6, 0, None, run)
        build = time.perf_counter() - t
        t = time.perf_counter()
        summary, _, _ = summarize_run(rec, run, cfg, n / args.seconds)
        summ = time.perf_counter() - t
        parts[n] = part_from_records(0, "node", rec, 50e6, 0, summary, run)
        print(f"| {n:,} | {build * 1e3:.0f} ms | {len(pickle.dumps(part)) / 1024:.0f} KiB | {summ * 1e3:.0f} ms |")
    print("\n## the driver's merge (merge_summary) of W parts of 100,000 requests each")
    print("| workers W | merge | per worker | merged parts' bytes |")
    print("|---|---|---|---|")
    base = parts[100_000]
    for w in (2, 10, 100, 300):
        ps = [base] * w
        times = []
        for _ in range(3 if w <= 100 else 1):
            t = time.perf_counter()
            merge_summary(ps, cfg, None)
            times.append(time.perf_counter() - t)
        best = min(times)
        size = len(pickle.dumps(base)) * w
        print(f"| {w} | {best:.2f} s | {best / w * 1e3:.1f} ms | {size / 2**20:.1f} MiB |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("rate", help="1 vs 2 workers: highest valid rate against a null endpoint")
    r.add_argument("--duration", type=float, default=4.0)
    r.add_argument("--start-rate", type=float, default=2000.0)
    r.add_argument("--max-rate", type=float, default=200_000.0)
    r.add_argument("--precision", type=float, default=0.1)
    r.add_argument("--tries", type=int, default=2)
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--server-core", type=int, default=0)
    r.add_argument("--cores", type=int, nargs=2, default=[0, 1], help="worker cores (1 worker: the second)")
    m = sub.add_parser("merge-cost", help="the driver's merge cost vs workers and histogram sizes")
    m.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args(argv)
    if args.cmd == "merge-cost":
        return cmd_merge_cost(args)
    if args.cmd in (None, "rate"):
        if args.cmd is None:
            args = ap.parse_args(["rate", *(argv or sys.argv[1:])])
        return cmd_rate(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

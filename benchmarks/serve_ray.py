"""Serving replicas on Ray Serve (issue 20): capacity of 1 vs 2 single-core replicas behind one endpoint.

* Cluster: a local 2-node Ray cluster (``ray.cluster_utils.Cluster``), one Ray CPU a node, started here.
* Deployment: ``latencylab.scaleout.serve_ray.deploy`` (what ``latencylab serve --ray --replicas N`` runs): the
  vision CNN, ladder ``fp32`` only (so the guard cannot trade accuracy for capacity), ``--threads 1``, one Ray
  CPU a replica, behind Ray Serve's HTTP proxy on 127.0.0.1.
* Capacity: the search of ``latencylab load --find-capacity`` (``load.capacity.repeat_capacity``: Poisson, the
  SLO below, batch-means verdicts), run here in-process so that ``--max-late`` can keep a chunk whose only
  fault is late sends (up to that fraction; a late send's latency still counts from its intended time, so it
  can only make a step look worse): on 2 busy vCPUs the generator's 1% rule otherwise decides every step.
  One search per replica count, the counts in the order given, the same settings.

This machine has 2 vCPUs: the proxy, the Ray daemons, the controller and the load generator share them with
the replicas, so 2 replicas cannot reach 2x here; the ratio printed is what 2 vCPUs allow.

    /tmp/lbench .venv/bin/python benchmarks/serve_ray.py [--replicas 1,2] [--slo p99=100ms]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, shutdown
from latencylab.serve.config import ModelConfig, ServerConfig
from ports import free_port


def capacity(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from latencylab.load.arrivals import Poisson
    from latencylab.load.capacity import SearchConfig, Segment, repeat_capacity
    from latencylab.load.generator import LoadConfig
    from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
    from latencylab.load.results import Slo
    from latencylab.load.runner import load_test

    slo = Slo.parse(args.slo)
    payloads = payloads_for_model(fetch_metadata(url, args.model), n=8, seed=0)
    path = infer_path(args.model)
    search = SearchConfig(start_rate=args.start_rate, precision=args.precision, chunk_s=args.step, max_chunks=3,
                          warmup_s=0.5, max_late_fraction=args.max_late)  # fmt: skip

    def measure(rate: float, seconds: float, seed: int, abort_when: Any) -> Segment:
        cfg = LoadConfig(duration_s=seconds, spin=args.spin)
        res, rec = load_test(url, path, payloads, Poisson(rate, seed), cfg, slo, 0.95, seed, abort_when=abort_when)
        return Segment.from_run(rate, res, rec)

    def on_step(st: dict[str, Any]) -> None:
        print(f"  offered {st['offered_rate']:.1f}/s  {'pass' if st['passed'] else 'FAIL'}: {st['why']}", flush=True)

    spread = repeat_capacity(measure, slo, search, 1, 0, on_step)
    return {"capacity_rate": spread.median, "goodput": spread.goodput, "reason": spread.searches[0].reason}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--model", default="vision")
    ap.add_argument("--ladder", default="fp32")
    ap.add_argument("--slo", default="p99=100ms")
    ap.add_argument("--start-rate", type=float, default=20.0)
    ap.add_argument("--step", type=float, default=3.0)
    ap.add_argument("--precision", type=float, default=0.15)
    ap.add_argument("--max-late", type=float, default=0.05, help="keep a chunk late on at most this share of sends")
    ap.add_argument("--spin", default="auto", help="the generator's busy-wait: auto spins only while a core is free")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    started = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, namespace="latencylab")
    model = ModelConfig(name=args.model, ladder=tuple(args.ladder.split(",")), slo_ms=200.0)
    cfg = ServerConfig(models=(model,), threads=1)
    env = {"env_vars": {k: os.environ[k] for k in ("LATENCYLAB_CACHE", "HF_HUB_OFFLINE") if k in os.environ}}
    rows = []
    try:
        for n in [int(x) for x in args.replicas.split(",")]:
            opts = ReplicaOptions(replicas=n, num_cpus=1, port=free_port(), runtime_env=env)
            t0 = time.time()
            url = deploy(cfg, opts)
            ready_s = time.time() - t0
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=30) as r:
                assert r.status == 200
            print(f"== {n} replica(s) at {url}, ready in {ready_s:.1f} s", flush=True)
            cap = capacity(url, args)
            rows.append((n, cap))
            shutdown(opts)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print()
    print(f"serve --ray --replicas N: {args.model} ({args.ladder}), threads 1, 1 Ray CPU a replica, SLO {args.slo}, "
          f"chunks of {args.step:g} s, precision {args.precision:g}, late sends kept up to {args.max_late:.0%}, "
          f"spin {args.spin}")  # fmt: skip
    print(f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} vCPUs, "
          f"total {time.time() - started:.0f} s")  # fmt: skip
    print(f"{'replicas':>8} {'capacity/s':>11} {'goodput/s':>10}  search")
    base = None
    for n, cap in rows:
        rate = cap.get("capacity_rate")
        base = rate if n == 1 else base
        good = cap.get("goodput")
        print(f"{n:>8} {rate or 0:>11.1f} {good or 0:>10.1f}  {cap.get('reason')}")
    two = next((c.get("capacity_rate") for n, c in rows if n == 2), None)
    if base and two:
        print(f"ratio 2 replicas / 1: {two / base:.2f}x")


if __name__ == "__main__":
    main()

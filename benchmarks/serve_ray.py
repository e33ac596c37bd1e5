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
the replicas, so 2 compute-bound replicas cannot reach 2x here; the ratio printed is what 2 vCPUs allow.

``--model fake`` (session 12) serves tests/fake_variants.py's variant instead: one request at a time
(``max_batch_size`` 1), ``--fake-ms`` (20 ms) of *sleep* each, so a replica's capacity is 1000 / fake-ms requests/s
while it leaves the cores to the generator, the proxy and the router: what is measured is Ray Serve's scale-out
(routing, spill-over, the retry of a shed request), not a model's compute. ``2-noretry`` in ``--replicas`` is 2
replicas with the retry of a shed request off (``ReplicaOptions.retry_shed`` 0, its default); a plain count
above 1 turns it on (2). Each step prints the
generator's own late-send share (the largest of its chunks) so that a step decided by the generator is seen.

    /tmp/lbench .venv/bin/python benchmarks/serve_ray.py [--replicas 1,2] [--slo p99=100ms]
    /tmp/lbench .venv/bin/python benchmarks/serve_ray.py --model fake --replicas 1,2-noretry,2 --slo p99=100ms \
        --start-rate 20 --step 2
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

    late: dict[float, float] = {}  # rate -> the largest late-send share of its chunks (the generator's own error)

    def measure(rate: float, seconds: float, seed: int, abort_when: Any) -> Segment:
        cfg = LoadConfig(duration_s=seconds, spin=args.spin)
        res, rec = load_test(url, path, payloads, Poisson(rate, seed), cfg, slo, 0.95, seed, abort_when=abort_when)
        late[rate] = max(late.get(rate, 0.0), float(res.summary.get("late_fraction") or 0.0))
        return Segment.from_run(rate, res, rec)

    def on_step(st: dict[str, Any]) -> None:
        print(f"  offered {st['offered_rate']:.1f}/s  {'pass' if st['passed'] else 'FAIL'} (generator late "
              f"<= {late.get(st['offered_rate'], 0):.1%}, shed {st.get('failed_fraction') or 0:.1%}): {st['why']}",
              flush=True)  # fmt: skip

    spread = repeat_capacity(measure, slo, search, 1, 0, on_step)
    passed = [st["offered_rate"] for st in spread.searches[0].steps if st["passed"]]
    at_cap = late.get(max(passed)) if passed else None
    return {"capacity_rate": spread.median, "goodput": spread.goodput, "reason": spread.searches[0].reason,
            "late_at_capacity": at_cap, "late_max": max(late.values(), default=0.0)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--model", default="vision", help="vision, text, or fake (a sleeping variant: --fake-ms)")
    ap.add_argument("--fake-ms", type=float, default=20.0, help="--model fake: ms a request (one at a time)")
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
    ladder = tuple(args.ladder.split(","))
    env_vars = {k: os.environ[k] for k in ("LATENCYLAB_CACHE", "HF_HUB_OFFLINE") if k in os.environ}
    if args.model == "fake":
        model = ModelConfig(name="fake", ladder=ladder, slo_ms=200.0, factory="fake_variants:make", max_batch_size=1)
        tests = str(Path(__file__).resolve().parents[1] / "tests")
        env_vars.update({"PYTHONPATH": tests, **{f"FAKE_DELAY_MS_{v.upper()}": f"{args.fake_ms:g}" for v in ladder}})
    else:
        model = ModelConfig(name=args.model, ladder=ladder, slo_ms=200.0)
    cfg = ServerConfig(models=(model,), threads=1)
    env = {"env_vars": env_vars}
    rows = []
    try:
        for spec in args.replicas.split(","):
            n, retry = int(spec.split("-")[0]), 0 if spec.endswith("-noretry") else 2
            opts = ReplicaOptions(replicas=n, num_cpus=1, port=free_port(), runtime_env=env, retry_shed=retry)
            t0 = time.time()
            url = deploy(cfg, opts)
            ready_s = time.time() - t0
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=30) as r:
                assert r.status == 200
            print(f"== {spec}: {n} replica(s) at {url}, retry of a shed request {retry}, ready in {ready_s:.1f} s",
                  flush=True)  # fmt: skip
            cap = capacity(url, args)
            rows.append((spec, n, cap))
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
    print(f"{'replicas':>10} {'capacity/s':>11} {'goodput/s':>10} {'late there':>10} {'late max':>9}  search")
    base = None
    for spec, n, cap in rows:
        rate = cap.get("capacity_rate")
        base = rate if n == 1 else base
        lat = cap.get("late_at_capacity")
        lat_txt = "-" if lat is None else format(lat, ".1%")
        print(f"{spec:>10} {rate or 0:>11.1f} {cap.get('goodput') or 0:>10.1f} {lat_txt:>10} {cap['late_max']:>9.1%}"
              f"  {cap.get('reason')}")  # fmt: skip
    for spec, n, cap in rows:
        if n > 1 and base and cap.get("capacity_rate"):
            print(f"ratio {spec} / 1: {cap['capacity_rate'] / base:.2f}x")


if __name__ == "__main__":
    main()

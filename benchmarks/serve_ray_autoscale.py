"""Autoscaling ``serve --ray`` on SLO pressure (issue 20): a ramp, the replica count over time, the switch times,
and the latency and shed per 5-s window.

* Cluster: a local 2-node Ray cluster (``ray.cluster_utils.Cluster``, started here), 2 logical CPUs a node.
* Model: the fake variant (tests/fake_variants.py) at ``--cost-ms`` (20) a request, batches of one, SLO
  ``--slo-ms`` (100): one replica answers at most 1000 / cost requests/s whatever the 2 vCPUs do (it sleeps),
  so the pressure is the model's, not this machine's. What is measured is the controller's behaviour (when it
  adds and removes replicas, what the clients see meanwhile), not a model's capacity.
* Deployment: ``--autoscale 1:MAX`` (``--max-replicas``, 3), 1 initial replica, the SLO-pressure policy at its
  default target 0.5, ``upscale_delay_s`` 5, ``downscale_delay_s`` 30, pressure averaged over 5 s.
* Load: Poisson steps (``--steps``, rate:seconds, default 20:15,45:15,70:20,110:20,30:15), every request with a
  deadline of the SLO (``x-latencylab-deadline-ms``: admission refuses what it predicts past it), then idle for
  ``--idle`` seconds while the replica count is watched, from a generator in this process.
* Printed: every change of the replica count (seconds since the load started, from -> to); per 5-s window the
  intended rate, sent, ok, shed, p50/p99 of the answered, and the replica count at the window's end.

    /tmp/lbench .venv/bin/python benchmarks/serve_ray_autoscale.py [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.load.arrivals import Schedule, Step
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, replica_count, shutdown
from latencylab.serve.config import ModelConfig, ServerConfig

TESTS = str(Path(__file__).resolve().parent.parent / "tests")


def windows(rec: Any, counts: list[tuple[float, int]], sched: Schedule, width: float = 5.0) -> list[dict[str, Any]]:
    t0 = int(rec.intended_ns.min())
    rel = (rec.intended_ns - t0) / 1e9
    lat = (rec.done_ns - rec.intended_ns) / 1e6
    out = []
    end = float(rel.max()) + 1e-9
    w = 0.0
    while w < end:
        m = (rel >= w) & (rel < w + width)
        ok = m & (rec.outcome == 0)
        at_end = [n for t, n in counts if t <= w + width]
        out.append({
            "from_s": w, "rate": sched.expected_between(w, w + width) / width, "sent": int(m.sum()),
            "ok": int(ok.sum()), "shed": int((m & (rec.outcome == 1)).sum()),
            "error": int((m & (rec.outcome == 2)).sum()),
            "p50_ms": float(np.percentile(lat[ok], 50)) if ok.any() else None,
            "p99_ms": float(np.percentile(lat[ok], 99)) if ok.any() else None,
            "replicas": at_end[-1] if at_end else None,
        })  # fmt: skip
        w += width
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-ms", type=float, default=20.0)
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--max-replicas", type=int, default=3)
    ap.add_argument("--steps", default="20:15,45:15,70:20,110:20,30:15")
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--json", default=None)
    ap.add_argument("--even", action="store_true",
                    help="start the cluster with RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING=0 (the proxy's router "
                    "without its preference for its own node's replicas)")  # fmt: skip
    args = ap.parse_args()
    if args.even:
        os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"  # inherited by the cluster's processes
    import ray
    from ray.cluster_utils import Cluster

    steps = [Step(float(d), float(r)) for r, d in (x.split(":") for x in args.steps.split(","))]
    sched = Schedule(steps, seed=7)
    print(f"# serve_ray_autoscale: cost {args.cost_ms:g} ms, SLO {args.slo_ms:g} ms, autoscale 1:{args.max_replicas},"
          f" steps {args.steps}, even routing {args.even}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}",
          flush=True)  # fmt: skip
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, namespace="latencylab")
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make",
                                           slo_ms=args.slo_ms, max_batch_size=1),))  # fmt: skip
    env = {"PYTHONPATH": TESTS, "FAKE_DELAY_MS_FP32": str(args.cost_ms)}
    opts = ReplicaOptions(replicas=1, autoscale=(1, args.max_replicas), port=args.port, push_s=0.5,
                          runtime_env={"env_vars": env}, request_timeout_s=10.0)  # fmt: skip
    counts: list[tuple[float, int]] = []
    stop = threading.Event()
    try:
        url = deploy(cfg, opts)
        payloads = payloads_for_model(fetch_metadata(url, "fake"), n=4, seed=0)
        t_load = time.monotonic()

        def watch() -> None:
            while not stop.is_set():
                counts.append((time.monotonic() - t_load, replica_count(opts)))
                stop.wait(0.5)

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        deadline = {"x-latencylab-deadline-ms": f"{args.slo_ms:g}"}  # admission refuses what would miss it
        res, rec = load_test(url, infer_path("fake"), payloads, sched,
                             LoadConfig(duration_s=sched.duration_s, timeout_s=10.0, headers=deadline))  # fmt: skip
        load_end = time.monotonic() - t_load
        deadline = time.monotonic() + args.idle
        while time.monotonic() < deadline and (not counts or counts[-1][1] > 1):
            time.sleep(0.5)
        time.sleep(1.0)
        stop.set()
        th.join()
    finally:
        shutdown(opts)
        ray.shutdown()
        c.shutdown()
    switches = [(t, a, b) for (_, a), (t, b) in itertools.pairwise(counts) if a != b]
    print(f"load ran {load_end:.1f} s; replica count changes (s since the load started):")
    for t, a, b in switches:
        print(f"  {t:6.1f} s: {a} -> {b}")
    s = res.summary
    print(f"sent {s['sent']} = ok {s['ok']} + shed {s['shed']} + error {s['error']}; p99 {s.get('p99_ms')} ms")
    rows = windows(rec, counts, sched)
    head = ("from s", "rate/s", "sent", "ok", "shed", "p50 ms", "p99 ms", "replicas")
    print(" ".join(f"{h:>8s}" for h in head))
    for r in rows:
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}"
        cells = (f"{r['from_s']:.0f}", f"{r['rate']:.1f}", r["sent"], r["ok"], r["shed"], p50, p99, r["replicas"])
        print(" ".join(f"{c!s:>8s}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps({"switches": switches, "windows": rows, "summary": s, "counts": counts},
                                              default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

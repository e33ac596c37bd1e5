"""The retry of a shed request on another replica (``serve --ray --retry-shed N``, issue 20): the same deployment
and load with the retry off and on, side by side.

* Cluster: a local 2-node Ray cluster (``ray.cluster_utils.Cluster``, started here), 2 logical CPUs a node;
  2 replicas of 1 Ray CPU, ``--retry-shed 2``.
* Model: the fake variant (tests/fake_variants.py) at ``--cost-ms`` (20) a request, batches of one, SLO 100 ms:
  one replica answers at most 1000 / cost requests/s (it sleeps: the 2 vCPUs are not what limits it).
* Load: Poisson at each ``--rates`` for ``--duration`` s, every request with a 100-ms deadline
  (``x-latencylab-deadline-ms``). "off": each request carries ``x-latencylab-shed-by`` (the mark of a request
  already retried: the replica answers it itself, a shed goes to the client); "on": without it. Rounds
  alternate off/on at each rate.
* Printed per rate and mode: sent, ok, shed, error, p50/p99 of the answered, the sheds offered to the other
  replica and answered there (``latencylab_server_shed_retries_total``), and each replica's share of requests.

    /tmp/lbench .venv/bin/python benchmarks/serve_ray_retry.py [--rates 45,60,80] [--duration 10]
"""

from __future__ import annotations

import argparse
import platform
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from latencylab.scaleout.serve_ray import SHED_BY, ReplicaOptions, deploy, shutdown
from latencylab.serve.config import ModelConfig, ServerConfig

TESTS = str(Path(__file__).resolve().parent.parent / "tests")


def counters(url: str) -> dict[str, float]:
    """Cluster-wide retry counters and each replica's answered requests."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics/cluster", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.name == "latencylab_server_shed_retries" and s.name.endswith("_total"):
                key = s.labels["outcome"]
            elif fam.name == "latencylab_server_requests" and s.name.endswith("_total"):
                key = f"requests:{s.labels['replica']}"
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost-ms", type=float, default=20.0)
    ap.add_argument("--rates", default="45,60,80")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=8124)
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    print(f"# serve_ray_retry: cost {args.cost_ms:g} ms, deadline 100 ms, rates {args.rates}, {args.duration:g} s "
          f"each; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}", flush=True)  # fmt: skip
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, namespace="latencylab")
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=100,
                                           max_batch_size=1),))  # fmt: skip
    env = {"PYTHONPATH": TESTS, "FAKE_DELAY_MS_FP32": str(args.cost_ms)}
    opts = ReplicaOptions(replicas=2, port=args.port, push_s=0.5, runtime_env={"env_vars": env}, retry_shed=2,
                          request_timeout_s=10.0)  # fmt: skip
    rows: list[tuple[Any, ...]] = []
    try:
        url = deploy(cfg, opts)
        payloads = payloads_for_model(fetch_metadata(url, "fake"), n=4, seed=0)
        deadline = {"x-latencylab-deadline-ms": "100"}
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            for mode in ("off", "on"):
                headers = {**deadline, SHED_BY: "client"} if mode == "off" else deadline
                before = counters(url)
                res, _ = load_test(url, infer_path("fake"), payloads, Poisson(rate, seed=10 + i),
                                   LoadConfig(duration_s=args.duration, timeout_s=10.0, headers=headers))  # fmt: skip
                time.sleep(1.5)  # the replicas push their counters every 0.5 s
                after = counters(url)
                d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                shares = sorted((v for k, v in d.items() if k.startswith("requests:")), reverse=True)
                s = res.summary
                rows.append((rate, mode, s["sent"], s["ok"], s["shed"], s["error"], s.get("p50_ms"), s.get("p99_ms"),
                             d.get("offered", 0.0), d.get("answered", 0.0), shares))  # fmt: skip
    finally:
        shutdown(opts)
        ray.shutdown()
        c.shutdown()
    print(f"{'rate':>5s} {'retry':>5s} {'sent':>5s} {'ok':>5s} {'shed':>5s} {'err':>4s} {'p50 ms':>7s} {'p99 ms':>7s} "
          f"{'offered':>7s} {'answered':>8s}  requests per replica")  # fmt: skip
    for rate, mode, sent, ok, shed, err, p50, p99, off, ans, shares in rows:
        f50 = "-" if p50 is None else f"{p50:.1f}"
        f99 = "-" if p99 is None else f"{p99:.1f}"
        print(f"{rate:5.0f} {mode:>5s} {sent:5d} {ok:5d} {shed:5d} {err:4d} {f50:>7s} {f99:>7s} {off:7.0f} {ans:8.0f}  "
              f"{' / '.join(f'{v:.0f}' for v in shares)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

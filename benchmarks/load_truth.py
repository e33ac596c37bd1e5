"""The load generator against ground truth, and the coordinated-omission demonstration.

1. Truth: latencylab's reference OIP server draws each service time from a known distribution
   (lognormal, median 40 ms, sigma 0.35) and records it; an open-loop Poisson run at 100 req/s is
   compared with (a) the quantiles of the service times actually drawn and (b) the distribution's.
2. Stall: the server freezes for 1 s, 3 s into an 8 s run. Open loop (50 req/s, constant) vs closed
   loop (1 user, as Locust/perf_analyzer-style tools measure): p99 and max of each, side by side.

    .venv/bin/python benchmarks/load_truth.py [--duration 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from latencylab.load.arrivals import Constant, Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from latencylab.workloads.synthetic import Distribution


@contextmanager
def server(*args: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "latencylab.load.reference_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split(" ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    args = ap.parse_args()
    path = infer_path("reference")
    spec = "lognormal(40ms,0.35)"
    dist = Distribution.parse(spec)
    with server("--service", spec, "--seed", "7") as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"))
        res, _ = load_test(url, path, payloads, Poisson(100, seed=1), LoadConfig(duration_s=args.duration), env={})
        with urllib.request.urlopen(f"{url}/debug/service_times") as r:
            drawn = np.asarray(json.loads(r.read()), dtype=float) / 1e6
    s = res.summary
    print(f"truth: service {spec}, open-loop Poisson 100/s for {args.duration:g} s, {s['sent']} requests")
    print(f"{'':6} {'reported':>10} {'drawn':>10} {'err':>7} {'theory':>10} {'err':>7}")
    for q, key in ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")):
        rep, real, th = s[key], float(np.quantile(drawn, q)), dist.quantile(q) / 1e6
        print(f"{key[:-3]:6} {rep:>8.2f}ms {real:>8.2f}ms {rep / real - 1:>+7.1%} {th:>8.2f}ms {rep / th - 1:>+7.1%}")
    print(f"lateness p99 {s['lateness_p99_ms']:.3f} ms, valid {s['valid']}, client CPU {s['client_cpu_percent']:.0f}%")
    if res.server:
        srv = res.server
        print(f"server mean {srv['server_stages_mean_ms']}, network+client {srv['network_and_client_mean_ms']:.2f} ms")

    stall = ("--service", "constant(10ms)", "--stall-at", "3", "--stall", "1s")
    with server(*stall) as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"))
        o, _ = load_test(url, path, payloads, Constant(50), LoadConfig(duration_s=8), env={})
    with server(*stall) as url:
        c, _ = load_test(url, path, payloads, None, LoadConfig(mode="closed", concurrency=1, duration_s=8), env={})
    with server(*stall) as url:
        cfg = LoadConfig(duration_s=8, connections=1, max_connections=1)
        w, _ = load_test(url, path, payloads, Constant(50), cfg, env={})
    print("\nstall: 10 ms service, the server freezes 1 s at t=3 s, 8 s runs")
    print(f"{'mode':28} {'sent':>5} {'p50':>9} {'p90':>9} {'p99':>9} {'max':>9} {'uncorr. p99':>12}")
    rows = (("open loop, 50/s constant", o), ("open loop, 1 connection", w), ("closed loop, 1 user", c))
    for name, r in rows:
        t = r.summary
        print(
            f"{name:28} {t['sent']:>5} {t['p50_ms']:>7.1f}ms {t['p90_ms']:>7.1f}ms {t['p99_ms']:>7.1f}ms "
            f"{t['max_ms']:>7.1f}ms {t['uncorrected_p99_ms']:>10.1f}ms"
        )
    print(f"open-loop note: {o.summary['coordinated_omission']}")
    print(
        f"1-connection note: {w.summary['coordinated_omission']}; valid {w.summary['valid']}: "
        f"{'; '.join(w.summary['invalid_reasons'])}"
    )
    print(f"closed-loop note: {c.summary['coordinated_omission']}")


if __name__ == "__main__":
    main()

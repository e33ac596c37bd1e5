"""``serve --ray --autoscale`` and ``--retry-shed`` on a local 2-node Ray cluster started here (slow tier; with the
other local-cluster modules, one at a time: tests/xdist_order.py).

* Autoscaling: under a load one replica cannot hold inside its SLO, Ray Serve, fed by the replicas' SLO
  pressure, adds replicas; once the load stops it goes back to the minimum; no request is lost on the way
  (sent = ok + shed + error).
* The retry of a shed request: of 2 replicas, Ray's proxy sends almost every request to its own node's one
  (measured while writing this: 392 of 394 at 45/s), which sheds what it cannot answer by the requests'
  100-ms deadline while the other idles. With the retry on, those sheds are answered by the other replica
  instead (the same deployment, the same load; the retry turned off per request by the header that marks a
  request already retried).

The model is the fake variant (tests/fake_variants.py) at 20 ms a request (batches of one): one replica answers
at most 50/s, whatever the 2 vCPUs do (the variant sleeps), so the pressure is the model's, not the machine's."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, replica_count, shutdown
from latencylab.serve.config import ModelConfig, ServerConfig
from ports import free_port
from ray_cluster import local_cluster

pytestmark = pytest.mark.slow
TESTS = str(Path(__file__).parent)
CFG = ServerConfig(
    models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=100, max_batch_size=1),)
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    # logical CPUs: 3 replicas of 1 Ray CPU fit (they sleep: the 2 vCPUs are not what limits them)
    with local_cluster(cpus_per_node=2, namespace="latencylab"):
        yield


@contextlib.contextmanager
def deployed(cfg: ServerConfig = CFG, **kw: Any) -> Iterator[tuple[str, ReplicaOptions]]:
    env = {"PYTHONPATH": TESTS, "FAKE_DELAY_MS_FP32": "20"}
    opts = ReplicaOptions(num_cpus=1, port=free_port(), push_s=0.5, runtime_env={"env_vars": env},
                          request_timeout_s=10.0, **kw)  # fmt: skip
    try:
        yield deploy(cfg, opts), opts
    finally:
        shutdown(opts)


@pytest.fixture
def served(cluster: None) -> Iterator[tuple[str, ReplicaOptions]]:
    with deployed(replicas=1, autoscale=(1, 3), upscale_delay_s=2.0, downscale_delay_s=4.0, look_back_s=3.0) as got:
        yield got


def test_replicas_follow_the_slo_pressure_up_and_back_down(served: tuple[str, ReplicaOptions]) -> None:
    url, opts = served
    assert replica_count(opts) == 1
    payloads = payloads_for_model(fetch_metadata(url, "fake"), n=4, seed=0)
    counts: list[tuple[float, int]] = []
    stop = threading.Event()

    def watch() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            counts.append((time.monotonic() - t0, replica_count(opts)))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # 80/s against one replica's 50/s: it sheds and predicts answers past its SLO until a second one starts
        t_load = time.monotonic()
        res, rec = load_test(url, infer_path("fake"), payloads, Poisson(80.0, seed=1),
                             LoadConfig(duration_s=25.0, timeout_s=10.0))  # fmt: skip
        load_s = time.monotonic() - t_load
        peak = max(n for _, n in counts)
        deadline = time.monotonic() + 60
        while replica_count(opts) > 1 and time.monotonic() < deadline:  # idle: back to the minimum
            time.sleep(0.5)
        final = replica_count(opts)
    finally:
        stop.set()
        watcher.join()
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] == rec.n  # nothing lost while replicas came and went
    changes = " ".join(f"{t:.1f}s:{n}" for i, (t, n) in enumerate(counts) if i == 0 or n != counts[i - 1][1])
    seen = f"replicas {changes}; load ended at {load_s:.1f}s"
    assert peak >= 2, seen  # it scaled up under the load
    assert final == 1, seen  # and back down once idle
    up = next(t for t, n in counts if n >= 2)
    # driven by the load: while it ran, or within the guard's 10-s window of it (what a busy machine's slower
    # replica start may need), not by time alone
    assert up < load_s + 10.0, seen


def _retries(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics/cluster", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "latencylab_server_shed_retries":
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    out[smp.labels["outcome"]] = out.get(smp.labels["outcome"], 0.0) + smp.value
    return out


def test_a_shed_request_is_answered_by_the_other_replica(cluster: None) -> None:
    from latencylab.scaleout.serve_ray import SHED_BY

    with deployed(replicas=2, retry_shed=2) as (url, _):
        payloads = payloads_for_model(fetch_metadata(url, "fake"), n=4, seed=0)
        load = Poisson(60.0, seed=2)  # one replica answers at most 50/s, two 100/s
        deadline = {"x-latencylab-deadline-ms": "100"}  # admission refuses what it predicts past it
        off, _ = load_test(
            url,
            infer_path("fake"),
            payloads,
            load,
            LoadConfig(duration_s=10.0, timeout_s=10.0, headers={**deadline, SHED_BY: "client"}),
        )
        before = _retries(url)
        on, _ = load_test(url, infer_path("fake"), payloads, load,
                          LoadConfig(duration_s=10.0, timeout_s=10.0, headers=deadline))  # fmt: skip
        time.sleep(1.5)  # the replicas push their counters every 0.5 s
        after = _retries(url)
    a, b = off.summary, on.summary
    for s in (a, b):
        assert s["sent"] == s["ok"] + s["shed"] + s["error"]
    if a["shed"] < 0.02 * a["sent"]:
        pytest.skip(f"Ray's router spread the load without the retry this time ({a['shed']} of {a['sent']} shed)")
    answered = after.get("answered", 0.0) - before.get("answered", 0.0)
    assert answered > 0, (before, after)  # sheds were answered by the other replica
    assert b["shed"] < 0.5 * a["shed"], (a["shed"], b["shed"], answered)

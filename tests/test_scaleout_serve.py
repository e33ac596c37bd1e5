"""``serve --ray --replicas N`` on a local 2-node Ray cluster started here (slow tier; on one part-2 worker
after test_scaleout_ray.py: tests/xdist_order.py): 2 Ray Serve replicas answer the OIP routes as one
``latencylab serve`` does, tritonclient works through Ray Serve's proxy, every replica's Prometheus histograms
have the same buckets, and a replica killed under load loses no admitted request without an explicit error
(sent = ok + shed + error).

The model is the fake variant (Y = 2 X, 2 ms a batch: tests/fake_variants.py): what is tested is the service and
its routes inside Ray Serve, not a model (the real models' outputs through the same service are tested by the
serve tests)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve")

from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, handle, shutdown
from latencylab.serve.app import build_state
from latencylab.serve.config import ModelConfig, ServerConfig
from ports import free_port
from servers import uvicorn_thread

# Not serial: no verdict here reads real time closely (the capacity search judges a median against 2.5x a
# 100-ms service; the rest count requests), so the modules run in part 2, one cluster at a time.
pytestmark = pytest.mark.slow

TESTS = str(Path(__file__).parent)
CFG = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=200),))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ReplicaOptions]]:
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, namespace="latencylab")
    # one CPU a replica, one CPU a node: the two replicas land on different nodes
    env = {"PYTHONPATH": TESTS}
    # the retry of a shed request on (its Ray test is not done: docs/scale.md): every infer answer goes through it
    # the proxy's end-to-end timeout under the load tests' client timeout (10 s): a request stuck on a killed
    # replica is answered 408 by the proxy, not left to the client
    opts = ReplicaOptions(replicas=2, num_cpus=1, port=free_port(), push_s=0.5, runtime_env={"env_vars": env},
                          retry_shed=2, request_timeout_s=5.0)  # fmt: skip
    try:
        yield deploy(CFG, opts), opts
    finally:
        shutdown(opts)
        ray.shutdown()
        c.shutdown()


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_two_replicas_answer_the_oip_routes_as_one_server(served: tuple[str, ReplicaOptions]) -> None:
    url, opts = served
    assert len({handle(opts).pid.remote().result() for _ in range(12)}) == 2  # two replicas, two processes
    rng = np.random.default_rng(0)
    bodies = [
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [n, 4], "data": rng.normal(size=4 * n).tolist()}]}
        for n in (1, 3, 2)
    ]
    bad = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2]}]}
    one = build_state(CFG, {"fake": __import__("fake_variants").make(["fp32"], 8, "cpu")})
    with uvicorn_thread(one) as (host, port):
        single = f"http://{host}:{port}"
        for path in ("/v2/health/ready", "/v2", "/v2/models/fake", "/v2/models/fake/ready", "/v2/models/nope"):
            assert _get(url + path) == _get(single + path), path
        for body in [*bodies, bad]:
            got, want = _post(url + "/v2/models/fake/infer", body), _post(single + "/v2/models/fake/infer", body)
            assert got[0] == want[0]
            if got[0] == 200:
                assert got[1]["outputs"] == want[1]["outputs"] and got[1]["model_version"] == "fp32"
            else:
                assert got[0] == 400 and got[1] == want[1]  # the same one-line JSON error
    # 16 concurrent requests reach both replicas: the proxy's node's replica takes 8 (max_ongoing_requests), the
    # rest spill over to the other node's
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda b: _post(url + "/v2/models/fake/infer", b)[0], bodies * 20))
    assert codes == [200] * 60
    time.sleep(1.5)  # each replica pushes its exposition every 0.5 s
    code, text = _get(url + "/metrics/cluster")
    assert code == 200
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    served_by = {s.labels["replica"]: s.value for s in fams["latencylab_server_requests"].samples
                 if s.name.endswith("_total") and s.labels.get("code") == "200"}  # fmt: skip
    assert len(served_by) == 2 and sum(served_by.values()) >= 63  # 3 + 60 answered (+ the pid probes: none)
    buckets: dict[str, set[str]] = {}  # the end-to-end request latency histogram, per replica
    for s in fams["latencylab_server_stage_seconds"].samples:
        if s.name.endswith("_bucket") and s.labels.get("stage") == "request":
            buckets.setdefault(s.labels["replica"], set()).add(s.labels["le"])
    assert len(buckets) == 2 and len({frozenset(b) for b in buckets.values()}) == 1  # same buckets: they add up
    code, own = _get(url + "/metrics")
    assert code == 200 and 'replica="' in own


def test_tritonclient_through_the_ray_serve_proxy(served: tuple[str, ReplicaOptions]) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    url, _ = served
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready("fake")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("X", [2, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer("fake", [inp], outputs=[httpclient.InferRequestedOutput("Y", binary_data=True)])
    np.testing.assert_array_equal(result.as_numpy("Y"), 2 * x)


def test_a_replica_killed_under_load_loses_no_request_silently(served: tuple[str, ReplicaOptions]) -> None:
    url, opts = served
    pids = set()
    for _ in range(20):
        pids.add(handle(opts).pid.remote().result())
        if len(pids) == 2:
            break
    victim = sorted(pids)[0]
    payloads = payloads_for_model(fetch_metadata(url, "fake"), n=4, seed=0)
    timer = threading.Timer(1.5, os.kill, (victim, signal.SIGKILL))
    timer.start()
    try:
        res, rec = load_test(url, infer_path("fake"), payloads, Poisson(30.0, seed=3), LoadConfig(duration_s=10.0,
                             timeout_s=10.0))  # fmt: skip
    finally:
        timer.cancel()
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] == rec.n  # every request has an outcome
    # the other replica took over: of the requests meant for the last 2.5 s (6 s after the kill, three of the
    # controller's 2-s health checks; a busy machine takes Ray longer to route around the dead replica: a CI run
    # with the judged window 3 s after the kill found 46% answered), most were answered. 30/s, not 60/s: one
    # survivor on a busy 2-vCPU host answered 60/s 6 s after the kill with 81 of 155 proxy timeouts (408), its own
    # capacity and not the takeover (checked with a CPU burner beside the test; 30/s passes there)
    late = rec.intended_ns >= 7.5e9
    statuses = dict(zip(*np.unique(rec.status[late], return_counts=True), strict=True))
    assert late.sum() > 0 and (rec.outcome[late] == 0).mean() >= 0.8, (s, int(late.sum()), statuses)
    # every failure is an explicit answer (an HTTP status from the proxy), none a timeout or a lost connection
    assert all(k.startswith("HTTP ") for k in s["errors_by_reason"]), s["errors_by_reason"]
    assert set(rec.status[rec.outcome != 0].tolist()) <= {408, 500, 502, 503}  # 408: the proxy's timeout
    assert (rec.outcome >= 0).all()

"""``serve --model gen --ray --replicas N`` on a local 2-node Ray cluster started here (slow tier; with the other
local-cluster modules, one at a time: tests/xdist_order.py): 2 Ray Serve replicas of the generative server answer
the OpenAI-compatible and OIP routes as one ``latencylab serve --model gen`` does, a streamed answer arrives
through Ray Serve's proxy as server-sent events, chunk by chunk, and ``/metrics/cluster`` holds both replicas.

The engine is the fake one (tests/genserve_servers.py, ``fake_service``: deterministic tokens, a few ms a step):
what is tested is the service and its routes inside Ray Serve (SmolLM2's answers through the same service are
tested by the genserve tests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from genserve_servers import events, fake_service, get, post
from latencylab.genserve.server import serve_in_thread
from latencylab.genserve.service import GenServeConfig
from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, handle, shutdown
from ports import free_port
from ray_cluster import local_cluster

pytestmark = pytest.mark.slow
TESTS = str(Path(__file__).parent)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ReplicaOptions]]:
    opts = ReplicaOptions(replicas=2, num_cpus=1, port=free_port(), push_s=0.5,
                          runtime_env={"env_vars": {"PYTHONPATH": TESTS}}, request_timeout_s=30.0)  # fmt: skip
    with local_cluster(cpus_per_node=1, namespace="latencylab"):  # one replica a node
        try:
            yield deploy(GenServeConfig(), opts, factory="genserve_servers:fake_service"), opts
        finally:
            shutdown(opts)


def test_two_gen_replicas_answer_as_one_server(served: tuple[str, ReplicaOptions]) -> None:
    url, opts = served
    assert len({handle(opts, "gen").pid.remote().result() for _ in range(12)}) == 2  # two replicas, two processes
    completion = {"model": "gen", "prompt": "hello", "max_tokens": 10}
    chat = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    bad = {"model": "gen", "prompt": "hello", "max_tokens": -1}
    with serve_in_thread(fake_service()) as single:
        for path in ("/v2/health/ready", "/v1/models", "/v2/models/gen"):
            assert get(url, path) == get(single, path), path
        for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            got, want = post(url, path, body), post(single, path, body)
            assert got[0] == want[0] == 200
            g, w = json.loads(got[2]), json.loads(want[2])
            assert g["choices"][0] == w["choices"][0] and g["usage"] == w["usage"], (g, w)
        got, want = post(url, "/v1/completions", bad), post(single, "/v1/completions", bad)
        assert got[0] == want[0] == 400 and json.loads(got[2]) == json.loads(want[2])  # the same JSON error


def test_a_streamed_answer_comes_through_the_proxy_as_events(served: tuple[str, ReplicaOptions]) -> None:
    url, _ = served
    body = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    status, headers, raw = post(url, "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    ev = events(raw)
    assert ev[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev[:-1] if e.get("choices"))
    with serve_in_thread(fake_service()) as single:
        want = events(post(single, "/v1/chat/completions", body)[2])
    assert text == "".join(e["choices"][0]["delta"].get("content") or "" for e in want[:-1] if e.get("choices"))
    assert len([e for e in ev if e != "[DONE]" and e.get("choices")]) > 1  # chunk by chunk, not one answer


def test_cluster_metrics_hold_both_gen_replicas(served: tuple[str, ReplicaOptions]) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    from prometheus_client.parser import text_string_to_metric_families

    url, _ = served
    # 24 at once: the proxy's node's replica takes 8 (max_ongoing_requests), the rest spill over to the other
    with ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda _: post(url, "/v1/completions", {"model": "gen", "prompt": "x", "max_tokens": 50}),
                      range(24)))  # fmt: skip
    time.sleep(1.5)  # every replica pushes its exposition each 0.5 s
    status, raw = get(url, "/metrics/cluster")
    assert status == 200
    replicas = {s.labels.get("replica") for fam in text_string_to_metric_families(raw.decode()) for s in fam.samples}
    assert len(replicas - {None}) == 2

"""The server freezes what start-up and warm-up left (gc.freeze) and times every garbage collection while it serves.

A full collection walks every tracked object with the GIL held: with the text model loaded (~394k objects) one took
220 ms here, idle; under 4x overload one stalled every answer for 360-385 ms and broke the p99 of two of three
runs (docs/benchmarks/serve.md, session 16). Frozen, those objects are skipped by every later collection."""

from __future__ import annotations

import gc
import urllib.request

from fake_variants import FakeVariant
from latencylab.serve.app import build_state
from latencylab.serve.config import ModelConfig, ServerConfig
from servers import uvicorn_thread


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return r.read().decode()


def _sample(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _state(freeze: bool):  # type: ignore[no-untyped-def]
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make"),), gc_freeze=freeze
    )
    return build_state(cfg, {"fake": [FakeVariant("fp32", 0.0005)]})


def test_a_warm_server_freezes_its_objects_and_times_each_collection() -> None:
    assert gc.get_freeze_count() == 0  # nothing else in this process holds objects frozen
    garbage = [[i] for i in range(200_000)]  # what start-up leaves behind: tracked, long-lived
    with uvicorn_thread(_state(True)) as (host, port):
        url = f"http://{host}:{port}"
        frozen = gc.get_freeze_count()
        assert frozen >= len(garbage)  # the start-up objects are in the permanent generation
        before = _sample(_metrics(url), "latencylab_server_gc_pause_seconds_count")
        gc.collect()  # a full collection while serving: timed
        text = _metrics(url)
        assert _sample(text, 'latencylab_server_gc_pause_seconds_count{generation="2"}') >= 1
        assert _sample(text, "latencylab_server_gc_pause_seconds_count") > before
        # the count at the freeze; frozen objects freed since (by reference counting) leave the generation
        assert frozen <= _sample(text, "latencylab_server_gc_frozen_objects") <= frozen + 1_000
    assert gc.get_freeze_count() == 0  # given back when the server stops
    del garbage


def test_gc_freeze_off_leaves_the_collector_alone() -> None:
    with uvicorn_thread(_state(False)) as (host, port):
        assert gc.get_freeze_count() == 0
        text = _metrics(f"http://{host}:{port}")
        assert _sample(text, "latencylab_server_gc_frozen_objects") == 0

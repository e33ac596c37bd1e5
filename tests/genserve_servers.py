"""The generative server for tests: the service on the fake engine or on SmolLM2, and the HTTP helpers the
genserve tests share (one place, so the fast and slow tiers start and talk to it the same way)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from latencylab.genserve.fake import FakeEngine, FakeTokenizer
from latencylab.genserve.scheduler import SchedulerConfig
from latencylab.genserve.server import serve_in_thread
from latencylab.genserve.service import GenServeConfig, GenService

REPLY = 5  # the fake reply: "abcd" then EOS


def fake_service(reply: int = REPLY, **over: Any) -> GenService:
    """The service over the fake engine (sleeping ~2 ms a decode step), warmed up; ``over``: GenServeConfig
    fields (context window 200 and a max_tokens limit of 100 unless given)."""
    eng = FakeEngine(None, prefill_ns_per_token=20_000, decode_base_ns=2_000_000, decode_ns_per_seq=100_000,
                     reply_len=lambda s: reply)  # fmt: skip
    standby = over.pop("standby", None)
    cfg = GenServeConfig(
        sched=over.pop("sched", SchedulerConfig(max_num_seqs=4)), context_window=over.pop("context_window", 200),
        max_tokens_limit=over.pop("max_tokens_limit", 100), **over,
    )  # fmt: skip
    svc = GenService(cfg, FakeTokenizer(), eng, frozenset({2}), standby=standby)
    svc.warmup(prompt_tokens=8, max_tokens=2)
    return svc


@contextmanager
def real_server(**over: Any) -> Iterator[tuple[str, GenService]]:
    """``latencylab serve --model gen``'s service over SmolLM2 on a real uvicorn (skips when the model or
    transformers is missing); yields (URL, service)."""
    pytest.importorskip("transformers")
    from latencylab.genserve.server import build_service

    cfg = GenServeConfig(sched=over.pop("sched", SchedulerConfig(max_num_seqs=8)), **over)
    try:
        svc = build_service(cfg)
    except Exception as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    with serve_in_thread(svc) as u:
        yield u, svc


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def post(
    url: str, path: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    """POST JSON (or raw bytes); (status, lower-cased headers, body)."""
    conn = _conn(url, timeout)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def get(url: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    conn = _conn(url, timeout)
    conn.request("GET", path)
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def events(body: bytes) -> list[Any]:
    """The ``data:`` events of an SSE body, JSON-decoded (``[DONE]`` as the string)."""
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def counts_of(obj: Any) -> dict[str, Any]:
    """The load result's summary (the dict with sent / ok / shed / error counts), wherever it sits."""
    if isinstance(obj, dict):
        if "sent" in obj and "ok" in obj:
            return obj
        for v in obj.values():
            found = counts_of(v)
            if found:
                return found
    return {}


def run_load(url: str, out: Any, *extra: str, timeout: float = 300) -> dict[str, Any]:
    """``latencylab load --url URL --model gen ...`` in its own process; the result file's document."""
    proc = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", "--url", url, "--model", "gen", "--json", str(out), *extra],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return dict(json.loads(out.read_text()))

"""Clients that leave: a request whose client has gone is not computed (it leaves the preprocess backlog and the
queue) and is counted as 499; a client that leaves while sending its body costs one quiet log line, no
traceback (issue 15, items 3 and 4).

The in-process tests drive the ASGI app directly and fire the request's disconnect notice themselves (the
``DisconnectHook`` our HTTP protocol puts in the scope); a variant held at a gate keeps the compute thread busy
while they act, so nothing races a sleep. One test closes real sockets against a real server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.testclient import TestClient

from fake_variants import FakeVariant
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.limits import DISCONNECT, DisconnectHook
from latencylab.serve.protocol_request import parse_infer_request
from latencylab.serve.service import Timing
from servers import uvicorn_thread
from test_serve_service import BODY, Gated, until

INFER = "/v2/models/fake/versions/fp32/infer"


def _state(variant: FakeVariant, **model: Any) -> Any:
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=1, **model),)
    )
    return build_state(cfg, {"fake": [variant]})


def _scope(hook: DisconnectHook | None, length: int) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": INFER,
        "raw_path": INFER.encode(),
        "query_string": b"",
        "headers": [(b"content-length", str(length).encode()), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    if hook is not None:
        scope["extensions"] = {DISCONNECT: hook}
    return scope


def _metric(text: str, prefix: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_queued_request_whose_client_left_is_not_computed_and_counts_499() -> None:
    """Request A computes (held at the gate); B queues behind it; B's client leaves: B leaves the queue at once
    (before A finishes), is answered 499 (to nobody) and counted so, and is never computed."""
    variant = Gated("fp32", 0.001)
    state = _state(variant)
    app = lifespan_app(state)
    svc = state.services["fake"]
    batcher = svc.batchers[0]
    body = json.dumps(BODY).encode()
    hook = DisconnectHook()
    sent: list[MutableMapping[str, Any]] = []

    async def run() -> tuple[int, int]:
        variant.batch_sizes.clear()
        variant.entered.clear()
        variant.gate.clear()
        req = parse_infer_request(body, "fake", None, svc.inputs)
        a = asyncio.ensure_future(svc.infer(req, Timing(svc.now_ns())))
        await until(variant.entered.is_set)
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        forever = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await forever.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        b = asyncio.ensure_future(app(_scope(hook, len(body)), receive, send))
        await until(lambda: len(batcher) == 1)
        hook.fire()
        await b
        queued_after = len(batcher)
        variant.gate.set()
        await a
        return queued_after, svc.in_flight

    with TestClient(app) as c:
        assert c.portal is not None
        queued_after, in_flight = c.portal.call(run)
        metrics = c.get("/metrics").text
    assert sent[0]["status"] == 499
    assert queued_after == 0 and in_flight == 0
    assert variant.batch_sizes == [1]  # A only: B was never computed
    assert _metric(metrics, 'latencylab_server_requests_total{code="499",model="fake",producer="-"}') == 1
    assert _metric(metrics, 'latencylab_server_requests_total{code="200"') == 0  # A was not through the app


def test_a_request_whose_client_left_before_a_preprocess_worker_took_it_is_not_preprocessed() -> None:
    """The preprocess pool's backlog is a queue too: a request cancelled while waiting for a worker is skipped
    (never preprocessed), and its admission reservation is released."""
    variant = Gated("fp32", 0.001, hold_preprocess=True)
    state = _state(variant)
    svc = state.services["fake"]
    req = parse_infer_request(json.dumps(BODY).encode(), "fake", None, svc.inputs)
    seen: list[int] = []
    real = variant.preprocess

    def counting(request: Any) -> Any:
        seen.append(1)
        return real(request)

    variant.preprocess = counting  # type: ignore[method-assign]

    async def go() -> None:
        await svc.start()
        try:
            variant.gate.clear()
            first = [asyncio.ensure_future(svc.infer(req, Timing(svc.now_ns()))) for _ in range(2)]  # both workers
            await until(lambda: len(seen) == 2)
            third = asyncio.ensure_future(svc.infer(req, Timing(svc.now_ns())))
            await asyncio.sleep(0.01)
            third.cancel()
            variant.gate.set()
            await asyncio.gather(*first)
            await until(lambda: svc.preprocessing == 0)
        finally:
            await svc.stop()

    asyncio.run(go())
    assert len(seen) == 2  # the cancelled third was never preprocessed
    assert svc.batchers[0]._reserved == 0 and svc.in_flight == 0


def test_a_client_that_leaves_while_sending_its_body_is_one_quiet_counted_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = _state(FakeVariant("fp32", 0.001))
    app = lifespan_app(state)
    sent: list[MutableMapping[str, Any]] = []
    messages = [{"type": "http.request", "body": b'{"inputs": [', "more_body": True}, {"type": "http.disconnect"}]

    async def run() -> None:
        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        await app(_scope(None, 1000), receive, send)

    with caplog.at_level(logging.DEBUG), TestClient(app) as c:
        assert c.portal is not None
        c.portal.call(run)
        metrics = c.get("/metrics").text
    assert sent[0]["status"] == 499
    records = [r for r in caplog.records if r.name.startswith("latencylab")]
    assert [r.getMessage() for r in records if "disconnect" in r.getMessage()] == [
        f"POST {INFER}: client disconnected after 12 bytes of its body"
    ]
    assert not any(r.exc_info for r in caplog.records) and not any(r.levelno >= logging.WARNING for r in records)
    assert _metric(metrics, 'latencylab_server_requests_total{code="499",model="fake",producer="-"}') == 1


def _get(address: tuple[str, int], path: str) -> str:
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()


def test_twenty_requests_sent_and_closed_at_once_are_not_computed() -> None:
    """The issue's reproduction against a real server: 20 requests to a 100-ms model, each connection closed
    right after sending. The first may be computing already; the rest leave the queue when their connections
    close: counted as 499, in_flight back to 0, and the next good request is answered at once (not after 2 s)."""
    variant = FakeVariant("fp32", 0.1)
    state = _state(variant)
    body = json.dumps(BODY).encode()
    raw = (
        f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with uvicorn_thread(state) as address:
        variant.batch_sizes.clear()
        for _ in range(20):
            with socket.create_connection(address) as conn:
                conn.sendall(raw)
        give_up = time.monotonic() + 10
        metrics = ""
        while time.monotonic() < give_up:
            metrics = _get(address, "/metrics")
            done = _metric(metrics, 'latencylab_server_requests_total{code="499"') + _metric(
                metrics, 'latencylab_server_requests_total{code="200"'
            )
            if done >= 20 and _metric(metrics, "latencylab_server_in_flight{") == 0:
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        with socket.create_connection(address, timeout=10) as conn:
            conn.sendall(raw.replace(b"Host: t\r\n", b"Host: t\r\nConnection: close\r\n"))
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        good_s = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    cancelled = _metric(metrics, 'latencylab_server_requests_total{code="499",model="fake",producer="-"}')
    assert cancelled >= 15, metrics
    assert _metric(metrics, "latencylab_server_in_flight{") == 0
    # what was cancelled was not computed, except a batch already running when its client left (one worker: at
    # most one such batch), plus the good request later
    assert len(variant.batch_sizes) <= 21 - cancelled + 1
    assert good_s < 1.0, good_s

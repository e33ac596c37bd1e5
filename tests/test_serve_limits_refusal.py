"""Refusal in the HTTP protocol (serve/head_refusal.py, serve/limits.py): a request admission would shed is
answered 503 + Retry-After by the connection from its head, with no ASGI task; the connection stays usable,
pipelined requests keep their order, and a body that may state its own deadline still goes to the app.

One real loopback server per module (uvicorn, the config ``run_server`` uses) on a FakeClock, with a variant whose
batch costs 50 ms of that clock: with the default 30-ms deadline every request is predicted late, with a 1-s
deadline header every request is admitted. A body that is not JSON is the witness: decoded by the app it is a
400; refused by the connection, a 503 that the protocol's own count records.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from fake_variants import admission_state
from latencylab.clock import FakeClock
from latencylab.serve.app import uvicorn_config
from servers import uvicorn_thread

NOT_JSON = b"{this is not JSON"
GOOD = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, Any]]:
    state = admission_state(FakeClock())
    config = uvicorn_config(state)
    with uvicorn_thread(state, config) as (_host, port):
        yield port, config.http.refuser


def _request(body: bytes, headers: dict[str, str] | None = None, path: str = "/v2/models/fake/infer") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return head.encode() + b"\r\n" + body


def _responses(conn: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``n`` complete responses (Content-Length framed) from ``conn``."""
    buf = b""
    out = []
    conn.settimeout(10)
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = conn.recv(65536)
            assert chunk, "connection closed inside a body"
            buf += chunk
        out.append((int(lines[0].split()[1]), headers, buf[:length]))
        buf = buf[length:]
    return out


def test_a_refusal_is_answered_by_the_connection_which_stays_usable(server: tuple[int, Any]) -> None:
    port, refuser = server
    before = refuser.refused
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_request(NOT_JSON))
        [(status, headers, body)] = _responses(conn, 1)
        assert status == 503, body  # the app would have said 400 (not JSON) had it seen it: the last test shows
        assert json.loads(body)["error"].startswith("overloaded (deadline)")
        assert int(headers["retry-after"]) >= 1 and headers.get("connection") != "close"
        assert refuser.refused == before + 1
        # the same connection: an admissible request (a 1-s deadline) reaches the app
        conn.sendall(_request(GOOD, {"x-latencylab-deadline-ms": "1000"}))
        [(status, _, body)] = _responses(conn, 1)
        assert status == 200, body
        assert refuser.refused == before + 1


def test_pipelined_requests_are_answered_in_order(server: tuple[int, Any]) -> None:
    port, refuser = server
    before = refuser.refused
    with socket.create_connection(("127.0.0.1", port)) as conn:
        # one write: refused, then one the app refuses as not JSON, then refused again (behind the app's cycle)
        conn.sendall(_request(NOT_JSON) + _request(NOT_JSON, {"x-latencylab-deadline-ms": "1000"}) + _request(GOOD))
        statuses = [s for s, _, _ in _responses(conn, 3)]
    assert statuses == [503, 400, 503]
    assert refuser.refused == before + 1  # the third waited behind the app's cycle: the app refused it


def test_the_app_decides_what_the_connection_is_not_sure_of(server: tuple[int, Any]) -> None:
    port, refuser = server
    before = refuser.refused
    with socket.create_connection(("127.0.0.1", port)) as conn:
        # a body stating its own (longer) deadline: the app decodes it and admits it
        stated = json.loads(GOOD)
        stated["parameters"] = {"deadline_ms": 1000}
        conn.sendall(_request(json.dumps(stated).encode()))
        # an unknown model, and a malformed X-Request-Start: the app's own answers (404, 400)
        conn.sendall(_request(NOT_JSON, path="/v2/models/nope/infer"))
        conn.sendall(_request(NOT_JSON, {"x-request-start": "yesterday"}))
        statuses = [s for s, _, _ in _responses(conn, 3)]
    assert statuses == [200, 404, 400]
    assert refuser.refused == before

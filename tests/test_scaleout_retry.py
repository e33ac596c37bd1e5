"""The ASGI plumbing of a replica's retry of a shed request (scaleout/serve_ray.py; fast tier, no Ray): a body is
read whole up to the limit, an oversized one is replayed to the app unchanged, and an app's answer is held whole
and sent on as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("starlette")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from latencylab.scaleout.serve_ray import call_asgi, read_body, replay_then, send_answer


async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    if len(body) > 10:
        return JSONResponse({"error": f"body of {len(body)} bytes over 10"}, status_code=413)
    return JSONResponse({"n": len(body), "head": body[:4].decode()}, status_code=503 if body == b"shed" else 200)


APP = Starlette(routes=[Route("/infer", _echo, methods=["POST"])])
SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
         "path": "/infer", "raw_path": b"/infer", "root_path": "", "query_string": b"", "headers": [],
         "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000)}  # fmt: skip


def _chunks(*parts: bytes) -> Any:
    msgs = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive() -> dict[str, Any]:
        return msgs.pop(0)

    return receive


def test_a_body_is_read_whole_up_to_the_limit_and_an_oversized_one_replayed_unchanged() -> None:
    async def go() -> None:
        assert await read_body(_chunks(b"ab", b"cd", b"e"), 10) == (b"abcde", True)
        receive = _chunks(b"0123", b"4567", b"89ab", b"cdef")
        head, whole = await read_body(receive, 6)
        assert (head, whole) == (b"01234567", False)  # stopped once past the limit, the rest not read
        sent: list[dict[str, Any]] = []

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        await APP(SCOPE, replay_then(head, receive), send)  # the app sees all 16 bytes and answers its own 413
        assert sent[0]["status"] == 413 and b"body of 16 bytes" in sent[1]["body"]

    asyncio.run(go())


def test_an_answer_is_held_whole_and_sent_on_as_it_was() -> None:
    async def go() -> None:
        status, headers, body = await call_asgi(APP, SCOPE, b"hello")
        assert status == 200 and body == b'{"n":5,"head":"hell"}'
        assert (b"content-type", b"application/json") in [(bytes(k), bytes(v)) for k, v in headers]
        assert (await call_asgi(APP, SCOPE, b"shed"))[0] == 503
        sent: list[dict[str, Any]] = []

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        await send_answer(send, status, headers, body)
        assert sent[0] == {"type": "http.response.start", "status": 200, "headers": headers}
        assert sent[1] == {"type": "http.response.body", "body": body, "more_body": False}

    asyncio.run(go())

"""What the two generative peers share (benchmarks/peers/gen_naive_server.py, gen_static_server.py): SmolLM2 in
FP32 through transformers ``generate``, an OpenAI-compatible streaming ``POST /v1/chat/completions`` on Starlette +
uvicorn (already in the project venv), and the hand-off of tokens from the generating thread to each request's
stream.

A request is a :class:`Job`: its prompt ids (the model's chat template), its ``max_tokens``, and a queue of
events the HTTP handler turns into Server-Sent Events (a text delta per token, then ``finish_reason``, a
``usage`` chunk and ``data: [DONE]``). The generating thread calls :meth:`Job.token` per new token id and
:meth:`Job.finish` once; the handler never touches the model. Both peers are what a user writes on a first try,
with no admission control: whatever arrives waits in the queue.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 1 << 20
MAX_TOKENS_LIMIT = 1024


@dataclass
class Job:
    """One chat request on its way through a peer's generating thread."""

    ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    out: list[int] = field(default_factory=list)
    done: bool = False
    arrived: float = field(default_factory=time.monotonic)

    def _put(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def token(self, tok: int, text: str) -> None:
        self.out.append(tok)
        self._put("text", text)

    def finish(self, reason: str) -> None:
        if not self.done:
            self.done = True
            self._put("end", reason)


class Detok:
    """Incremental detokenisation: the text a new token adds to what was sent (decode all, send the suffix)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.sent = ""
        self.ids: list[int] = []

    def add(self, tok: int) -> str:
        self.ids.append(tok)
        text = str(self.tok.decode(self.ids, skip_special_tokens=True))
        if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new


def load(threads: int) -> tuple[Any, Any, set[int]]:
    """(tokenizer, model, EOS ids) of the packaged SmolLM2 in FP32, torch at ``threads`` intra-op threads."""
    import torch

    from latencylab.workloads.gen_decode import eos_ids
    from latencylab.workloads.gen_model import load_model

    torch.set_num_threads(threads)
    lm = load_model()
    return lm.tokenizer, lm.model, set(eos_ids(lm.tokenizer, lm.model))


def prompt_ids(tokenizer: Any, body: dict[str, Any]) -> list[int]:
    from latencylab.workloads.gen import chat_ids

    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    return chat_ids(tokenizer, msgs)


def build_app(tokenizer: Any, submit: Callable[[Job], None], name: str, stats: Callable[[], dict[str, Any]]) -> Any:
    """The Starlette app: ``/v1/models``, ``/health``, ``/stats`` and streaming ``/v1/chat/completions``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def error(status: int, msg: str) -> Response:
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error"}}, status_code=status)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "peer"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def get_stats(request: Request) -> Response:
        return JSONResponse(stats())

    async def chat(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return error(413, f"body over {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            ids = prompt_ids(tokenizer, body)
            n = body.get("max_tokens", 256)
            if not isinstance(n, int) or not 0 < n <= MAX_TOKENS_LIMIT:
                raise ValueError(f"max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}")
        except (ValueError, TypeError) as exc:
            return error(400, str(exc))
        job = Job(ids, n, asyncio.get_running_loop())
        submit(job)
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            c = {"id": rid, "object": "chat.completion.chunk", "model": name,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
            return f"data: {json.dumps(c)}\n\n"

        async def stream() -> AsyncIterator[str]:
            yield chunk({"role": "assistant"})
            while True:
                kind, value = await job.events.get()
                if kind == "text":
                    if value:
                        yield chunk({"content": value})
                    continue
                yield chunk({}, value)
                usage = {"prompt_tokens": len(ids), "completion_tokens": len(job.out),
                         "total_tokens": len(ids) + len(job.out)}  # fmt: skip
                last = {"id": rid, "object": "chat.completion.chunk", "choices": [], "usage": usage}
                yield f"data: {json.dumps(last)}\n\n"
                yield "data: [DONE]\n\n"
                return

        return StreamingResponse(stream(), media_type="text/event-stream")

    routes = [
        Route("/v1/models", models), Route("/health", health), Route("/stats", get_stats),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]  # fmt: skip
    return Starlette(routes=routes)


def serve(app: Any, host: str, port: int) -> None:
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    print(f"listening http://{host}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


def start_worker(target: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True, name="generate")
    t.start()
    return t

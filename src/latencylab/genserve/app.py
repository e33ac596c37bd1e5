"""HTTP for the generative server: OpenAI-compatible routes and the OIP generate extension, on Starlette.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true``: SSE chunks, a usage chunk
with ``stream_options.include_usage``, ``data: [DONE]``), ``GET /v1/models``; ``POST
/v2/models/{m}/generate`` (one JSON answer) and ``/generate_stream`` (SSE ``text_output`` events);
``GET /v2/health/live``, ``/v2/health/ready``, ``/v2/models/{m}``; ``GET /metrics``. Errors are OpenAI's
``{"error": {"message", "type", "param", "code"}}`` on /v1 and OIP's ``{"error": "..."}`` on /v2, never a
5xx for bad input; overload is 503 + Retry-After. A client that disconnects cancels its sequence (freed at
the next step).

Every answer says which rung of the SLO guard's ladder produced it: a ``latencylab`` object in the body (the
final chunk of a stream) with ``rung``, ``producer``, ``cached``, ``max_tokens_cap`` and ``capped``, and the
``X-LatencyLab-Rung`` (``-Max-Tokens-Cap``, ``-Cache``) headers. ``GET /v2/models/{m}/guard`` shows the ladder,
the guard's state and the cache. With a tracer provider, each request is one ``infer`` span (the caller's
``traceparent`` its parent) with ``queue``, ``prefill``, ``decode`` and ``send`` children
(serve/tracing.py), emitted when the request ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from latencylab.genserve.api import BadRequest, GenParams, parse_chat, parse_completions, parse_generate
from latencylab.genserve.service import GenService, TokenStream
from latencylab.serve.admission import Shed, retry_after_header
from latencylab.serve.limits import DISCONNECT, DisconnectHook, HttpLimits

log = logging.getLogger("latencylab.genserve")
JSON = "application/json"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _oai_error(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> Response:
    kinds = {401: "authentication_error", 404: "not_found_error", 503: "overloaded_error"}
    kind = kinds.get(status, "invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return Response(json.dumps(body), status, media_type=JSON, headers=headers)


def _oip_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps({"error": message}), status, media_type=JSON, headers=headers)


def build_gen_app(
    svc: GenService, token: str | None = None, lifespan: Any = None, tracer_provider: Any = None
) -> Starlette:
    ids = itertools.count(1)
    cfg = svc.cfg
    tracer: Any = None  # opentelemetry is imported only when spans are exported
    if tracer_provider is not None:
        from latencylab.serve.tracing import RequestTracer

        tracer = RequestTracer(tracer_provider)

    def authorised(request: Request) -> bool:
        if token is None:
            return True
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    async def read_body(request: Request) -> bytes:
        length = request.headers.get("content-length", "").strip()
        if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > cfg.max_body_bytes):
            raise BadRequest(f"request body exceeds the limit of {cfg.max_body_bytes} bytes", 413)

        async def read() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > cfg.max_body_bytes:
                    raise BadRequest(f"request body exceeds the limit of {cfg.max_body_bytes} bytes", 413)
                chunks.append(chunk)
            return b"".join(chunks)

        try:  # a client trickling its body holds only itself, and not past the limit (serve/limits.py)
            return await asyncio.wait_for(read(), HttpLimits().body_timeout_s)
        except TimeoutError:
            raise BadRequest(f"request body not received within {HttpLimits().body_timeout_s:g} s", 408) from None

    def check_model(name: str | None) -> None:
        if name is not None and name not in svc.names:
            raise BadRequest(f"unknown model {name!r}; this server has {svc.cfg.model_name!r}", 404, "model")

    async def open_stream(request: Request, parse: Any) -> tuple[GenParams, TokenStream]:
        start, epoch0 = svc.now_ns(), time.time_ns()
        body = await read_body(request)
        params = parse(body)
        check_model(params.model)
        stream = svc.open(params, start)
        stream.epoch0 = epoch0
        return params, stream

    def watch(request: Request, stream: TokenStream) -> DisconnectHook | None:
        hook: DisconnectHook | None = request.scope.get("extensions", {}).get(DISCONNECT)
        if hook is not None:
            hook.add(lambda: svc.cancel(stream))
        return hook

    async def refusal(request: Request, oai: bool, fn: Any) -> Response:
        """Run ``fn`` (a coroutine function returning a Response) and turn refusals into error answers."""
        err = _oai_error if oai else (lambda st, msg, param=None, headers=None: _oip_error(st, msg, headers))
        if not authorised(request):
            return err(401, "missing or wrong bearer token")
        try:
            return await fn()
        except BadRequest as exc:
            svc.metrics.requests.labels(cfg.model_name, str(exc.status), "-").inc()
            # 408/413: the rest of the body was not read; close rather than drain it
            return err(exc.status, str(exc), exc.param, {"Connection": "close"} if exc.status in (408, 413) else None)
        except Shed as exc:
            svc.metrics.shed.labels(cfg.model_name, exc.reason).inc()
            svc.metrics.requests.labels(cfg.model_name, "503", "-").inc()
            msg = f"overloaded ({exc.reason}): predicted time to first token {exc.retry_after_s:.2f} s"
            return err(503, msg, None, {"Retry-After": retry_after_header(exc.retry_after_s)})
        except ClientDisconnect:
            return err(499, "client closed the connection")

    # -- OpenAI

    def usage(stream: TokenStream) -> dict[str, Any]:
        p, c = stream.prompt_tokens, stream.completion_tokens
        # OpenAI's field for prompt tokens a prompt cache held (here: the prefix cache, genserve/prefix.py)
        cached = stream.seq.cached_tokens if stream.seq is not None else 0
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip

    def openai_route(chat: bool) -> Any:
        parse = (lambda b: parse_chat(b, cfg.max_tokens_limit)) if chat else (
            lambda b: parse_completions(b, cfg.max_tokens_limit))  # fmt: skip

        async def handler(request: Request) -> Response:
            async def run() -> Response:
                params, stream = await open_stream(request, parse)
                rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(ids)}"
                created = int(time.time())
                if params.stream:
                    return StreamingResponse(
                        sse_openai(request, stream, rid, created, chat), media_type="text/event-stream",
                        headers={**SSE_HEADERS, **stream.headers()},
                    )  # fmt: skip
                text = await whole(request, stream)
                if stream.finish == "error":
                    done(request, stream)
                    return _oai_error(500, stream.error or "generation failed")
                choice: dict[str, Any] = {"index": 0, "finish_reason": stream.finish_reason, "logprobs": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                body = {
                    "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": cfg.model_name, "choices": [choice], "usage": usage(stream),
                    "latencylab": stream.label(),
                }  # fmt: skip
                done(request, stream)
                return Response(json.dumps(body), media_type=JSON, headers=stream.headers())

            return await refusal(request, True, run)

        return handler

    async def whole(request: Request, stream: TokenStream) -> str:
        watch(request, stream)  # a no-op once the stream has finished
        try:
            return "".join([piece async for piece in stream.chunks()])
        finally:
            if not stream.finish:
                svc.cancel(stream)

    def done(request: Request, stream: TokenStream, code: str | None = None) -> None:
        if code is None:
            code = "200" if stream.finish not in ("cancelled", "error") else (
                "499" if stream.finish == "cancelled" else "500")  # fmt: skip
        svc.metrics.requests.labels(cfg.model_name, code, stream.finish or "cancelled").inc()
        if tracer is not None and tracer.enabled:
            trace(request, stream)

    def trace(request: Request, stream: TokenStream) -> None:
        """The request's span and its children (the module docstring), from the times its sequence kept."""
        start, end = stream.start_ns, svc.now_ns()

        def ep(ns: int) -> int:
            return stream.epoch0 + (ns - start)

        label = stream.label()
        attrs: dict[str, Any] = {
            "latencylab.model": cfg.model_name, "latencylab.rung": label["rung"],
            "latencylab.producer": label["producer"], "latencylab.cached": label["cached"],
            "latencylab.capped": label["capped"], "latencylab.finish_reason": stream.finish or "cancelled",
            "latencylab.prompt_tokens": stream.prompt_tokens, "latencylab.completion_tokens": stream.completion_tokens,
        }  # fmt: skip
        spans: list[tuple[str, int, int]] = []
        seq = stream.seq
        if seq is None:  # answered from the cache
            spans.append(("cache", ep(start), ep(end)))
        else:
            joined = seq.joined_ns if seq.joined_ns is not None else end
            spans.append(("queue", ep(start), ep(joined)))
            first = seq.first_token_ns
            if seq.joined_ns is not None:
                spans.append(("prefill", ep(joined), ep(first if first is not None else end)))
            if first is not None:
                last = seq.token_ns[-1]
                spans.append(("decode", ep(first), ep(last)))
                spans.append(("send", ep(last), ep(max(last, end))))
                attrs["latencylab.ttft_ms"] = (first - start) / 1e6
                if len(seq.token_ns) >= 2:
                    attrs["latencylab.tpot_ms"] = (last - first) / (len(seq.token_ns) - 1) / 1e6
        tracer.emit(dict(request.headers), ep(start), ep(end), spans, attrs)

    async def sse_openai(
        request: Request, stream: TokenStream, rid: str, created: int, chat: bool
    ) -> AsyncIterator[bytes]:
        watch(request, stream)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, role: bool = False) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                d: dict[str, str] = {}
                if role:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                choice["delta"] = d
            else:
                choice["text"] = delta or ""
                choice["logprobs"] = None
            body = {"id": rid, "object": obj, "created": created, "model": cfg.model_name, "choices": [choice]}
            if finish is not None:
                body["latencylab"] = stream.label()
            return b"data: " + json.dumps(body).encode() + b"\n\n"

        try:
            if chat:
                yield chunk("", None, role=True)
            async for piece in stream.chunks():
                yield chunk(piece, None)
            if stream.finish == "error":
                err = {"error": {"message": stream.error or "generation failed", "type": "server_error", "code": 500}}
                yield b"data: " + json.dumps(err).encode() + b"\n\n"
            else:
                yield chunk(None if chat else "", stream.finish_reason)
                if stream.params.include_usage:
                    body = {"id": rid, "object": obj, "created": created, "model": cfg.model_name, "choices": [],
                            "usage": usage(stream)}  # fmt: skip
                    yield b"data: " + json.dumps(body).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            done(request, stream)
        finally:
            if not stream.finish:  # the client went away mid-stream (the generator was closed)
                svc.cancel(stream)
                done(request, stream, "499")

    async def models(request: Request) -> Response:
        if not authorised(request):
            return _oai_error(401, "missing or wrong bearer token")
        served = {"latencylab": svc.served} if svc.served else {}  # the optimize search's variant (--from)
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "latencylab", **served} for n in svc.names]
        return Response(json.dumps({"object": "list", "data": data}), media_type=JSON)

    # -- OIP generate

    def generate_route(streaming: bool) -> Any:
        async def handler(request: Request) -> Response:
            async def run() -> Response:
                name = request.path_params["model"]
                if name not in svc.names:
                    raise BadRequest(f"unknown model {name!r}; this server has {cfg.model_name!r}", 404)
                _params, stream = await open_stream(
                    request, lambda b: parse_generate(b, cfg.max_tokens_limit, streaming)
                )
                if streaming:
                    return StreamingResponse(
                        sse_oip(request, stream), media_type="text/event-stream",
                        headers={**SSE_HEADERS, **stream.headers()},
                    )  # fmt: skip
                text = await whole(request, stream)
                done(request, stream)
                if stream.finish == "error":
                    return _oip_error(500, stream.error or "generation failed")
                body = {"model_name": cfg.model_name, "model_version": "1", "text_output": text,
                        "finish_reason": stream.finish_reason, "prompt_tokens": stream.prompt_tokens,
                        "completion_tokens": stream.completion_tokens, "latencylab": stream.label(),
                        "cached_prompt_tokens": stream.seq.cached_tokens if stream.seq is not None else 0}  # fmt: skip
                return Response(json.dumps(body), media_type=JSON, headers=stream.headers())

            return await refusal(request, False, run)

        return handler

    async def sse_oip(request: Request, stream: TokenStream) -> AsyncIterator[bytes]:
        watch(request, stream)
        try:
            async for piece in stream.chunks():
                body = {"model_name": cfg.model_name, "model_version": "1", "text_output": piece}
                yield b"data: " + json.dumps(body).encode() + b"\n\n"
            if stream.finish == "error":
                yield b"data: " + json.dumps({"error": stream.error or "generation failed"}).encode() + b"\n\n"
            else:
                end = {
                    "model_name": cfg.model_name, "model_version": "1", "text_output": "",
                    "finish_reason": stream.finish_reason, "completion_tokens": stream.completion_tokens,
                    "latencylab": stream.label(),
                }  # fmt: skip
                yield b"data: " + json.dumps(end).encode() + b"\n\n"
            done(request, stream)
        finally:
            if not stream.finish:
                svc.cancel(stream)
                done(request, stream, "499")

    # -- health, metadata, metrics

    async def live(request: Request) -> Response:
        return Response(b'{"live":true}', media_type=JSON)

    async def ready(request: Request) -> Response:
        ok = svc.failed == "" and request.app.state.ready
        return Response(b'{"ready":%s}' % (b"true" if ok else b"false"), 200 if ok else 503, media_type=JSON)

    async def model_meta(request: Request) -> Response:
        if not authorised(request):
            return _oip_error(401, "missing or wrong bearer token")
        name = request.path_params["model"]
        if name not in svc.names:
            return _oip_error(404, f"unknown model {name!r}; this server has {cfg.model_name!r}")
        s = cfg.sched
        meta = {
            "name": cfg.model_name, "versions": ["1"], "platform": "latencylab-genserve",
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
            "parameters": {"context_window": cfg.context_window, "max_tokens_limit": cfg.max_tokens_limit,
                           "max_num_seqs": s.max_num_seqs, "kv_budget_tokens": s.kv_budget_tokens,
                           "prefill_chunk_tokens": s.prefill_chunk_tokens, "ttft_slo_s": cfg.ttft_slo_s,
                           "tpot_slo_s": cfg.tpot_slo_s, "ladder": svc.snapshot()["ladder"],
                           **({"served": svc.served} if svc.served else {})},
        }  # fmt: skip
        return Response(json.dumps(meta), media_type=JSON)

    async def guard_state(request: Request) -> Response:
        if not authorised(request):
            return _oip_error(401, "missing or wrong bearer token")
        name = request.path_params["model"]
        if name not in svc.names:
            return _oip_error(404, f"unknown model {name!r}; this server has {cfg.model_name!r}")
        return Response(json.dumps(svc.snapshot()), media_type=JSON)

    async def metrics(request: Request) -> Response:
        return Response(svc.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/v1/completions", openai_route(False), methods=["POST"]),
        Route("/v1/chat/completions", openai_route(True), methods=["POST"]),
        Route("/v1/models", models),
        Route("/v2/models/{model}/generate", generate_route(False), methods=["POST"]),
        Route("/v2/models/{model}/generate_stream", generate_route(True), methods=["POST"]),
        Route("/v2/models/{model}", model_meta),
        Route("/v2/models/{model}/guard", guard_state),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/metrics", metrics),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"no route {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return _oai_error(exc.status_code, message, headers=dict(exc.headers or {}))

    async def internal_error(request: Request, exc: Exception) -> Response:
        return _oai_error(500, f"internal server error ({type(exc).__name__})")

    app = Starlette(
        routes=routes, exception_handlers={HTTPException: http_error, Exception: internal_error}, lifespan=lifespan
    )
    app.state.ready = False
    return app


def lifespan_gen_app(svc: GenService, token: str | None = None, tracer_provider: Any = None) -> Starlette:
    """The app with the step thread started on startup and stopped on shutdown."""
    holder: dict[str, Starlette] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc.start(asyncio.get_running_loop())
        holder["app"].state.ready = True
        try:
            yield
        finally:
            holder["app"].state.ready = False
            await asyncio.to_thread(svc.stop)

    app = build_gen_app(svc, token, lifespan, tracer_provider)
    holder["app"] = app
    return app

"""The HTTP layer: Open Inference Protocol (KServe v2) routes on Starlette, served by uvicorn.

Routes: GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{m}[/versions/{v}][/ready],
POST /v2/models/{m}[/versions/{v}]/infer, GET /metrics. A model's versions are its ladder's
variants: ``/versions/int8/infer`` pins a variant (bypassing the guard), plain ``/infer`` follows
the ladder. Errors are ``{"error": "..."}`` with a 4xx/5xx status; overload is 503 + Retry-After, decided before
the body is decoded whenever the headers tell the deadline (serve/early.py), and in the HTTP protocol, before a
handler exists, by default (serve/head_refusal.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import hmac
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from latencylab.clock import Clock, PerfCounterClock
from latencylab.serve.admission import retry_after_header
from latencylab.serve.batcher import now_reader
from latencylab.serve.config import ServerConfig
from latencylab.serve.early import early_refusal
from latencylab.serve.limits import DISCONNECT, DisconnectHook, HttpLimits, guarded_protocol
from latencylab.serve.metrics import ServerMetrics
from latencylab.serve.protocol_request import (
    BINARY_HEADER,
    check_requested_outputs,
    deadline_from_header,
    decode_infer_request,
)
from latencylab.serve.protocol_response import encode_infer_body, error_body, model_metadata, server_metadata
from latencylab.serve.request_start import HEADER as REQUEST_START_HEADER
from latencylab.serve.request_start import request_age_ns
from latencylab.serve.service import ModelService, ServiceError, Timing
from latencylab.serve.types import ProtocolError, Variant

if TYPE_CHECKING:  # OpenTelemetry loads only when a server builds its state (the gen server imports bind)
    from latencylab.serve.tracing import RequestTracer

log = logging.getLogger("latencylab.serve")
JSON = "application/json"
DEADLINE_HEADER = "x-latencylab-deadline-ms"  # alternative to the OIP parameter "deadline_ms"


def _error(
    status: int, message: str, retry_after_s: float | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    all_headers = dict(headers or {})
    if retry_after_s is not None:
        all_headers["Retry-After"] = retry_after_header(retry_after_s)
    if status in (408, 413):  # the rest of the body was not read: close rather than drain a slow or huge upload
        all_headers["Connection"] = "close"
    return Response(error_body(message), status_code=status, media_type=JSON, headers=all_headers or None)


@dataclass
class ServerState:
    cfg: ServerConfig
    services: dict[str, ModelService]
    metrics: ServerMetrics
    tracer: RequestTracer
    token: str | None
    ready: bool = False
    clock: Clock = field(default_factory=PerfCounterClock)  # the services' clock: request marks are on it too
    limits: HttpLimits = field(default_factory=HttpLimits)  # head/body sizes and read times (serve/limits.py)


def _authorised(state: ServerState, request: Request) -> bool:
    if state.token is None:
        return True
    got = request.headers.get("authorization", "")
    return hmac.compare_digest(got.encode(), f"Bearer {state.token}".encode())


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 past ``limit`` bytes and with 408 if it has not all come in ``timeout_s``."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":  # tritonclient can gzip or deflate a request: say so instead of "not valid UTF-8"
        raise ProtocolError(f"Content-Encoding {encoding[:20]!r} not supported: send the body uncompressed", 415)
    length = request.headers.get("content-length", "").strip()
    # ASCII digits only ("²".isdigit() is true), and no int() of thousands of digits (Python refuses past 4300)
    if length.isascii() and length.isdigit() and (len(length) > 18 or int(length) > limit):
        shown = length if len(length) <= 20 else f"{length[:20]}..."
        raise ProtocolError(f"request body of {shown} bytes exceeds the limit of {limit}", 413)

    async def read() -> bytes:
        chunks = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ProtocolError(f"request body exceeds the limit of {limit} bytes", 413)
                chunks.append(chunk)
        except ClientDisconnect:
            raise _ClientGone(f"client disconnected after {size} bytes of its body") from None
        return b"".join(chunks)

    # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the read in a task of its own, and waking the
    # handler from it costs two more passes of the event loop, each of which, under 4x overload, waits behind
    # every refusal ready meanwhile (docs/benchmarks/serve.md, session 18: 1.5 ms at the median at 1920/s)
    try:
        async with asyncio.timeout(timeout_s):
            return await read()
    except TimeoutError:
        raise ProtocolError(f"request body not received within {timeout_s:g} s", 408) from None


class _ClientGone(Exception):
    """The client closed its connection before its whole body came (counted as 499, one log line)."""


def build_app(state: ServerState, lifespan: Any = None) -> Starlette:
    now_ns = now_reader(state.clock)

    def service_for(request: Request) -> tuple[ModelService, str | None]:
        name = request.path_params["model"]
        svc = state.services.get(name)
        if svc is None:
            raise ProtocolError(f"unknown model {name!r}; this server has {', '.join(sorted(state.services))}", 404)
        version = request.path_params.get("version")
        if version is not None and version not in svc.ladder:
            raise ProtocolError(f"model {name!r} has no version {version!r}; versions: {', '.join(svc.ladder)}", 404)
        return svc, version

    async def live(request: Request) -> Response:
        return Response(b'{"live":true}', media_type=JSON)

    async def ready(request: Request) -> Response:
        return Response(
            b'{"ready":%s}' % (b"true" if state.ready else b"false"), 200 if state.ready else 503, media_type=JSON
        )

    async def server_meta(request: Request) -> Response:
        import json

        extensions = ["binary_tensor_data", "latencylab-ladder"]
        return Response(json.dumps(server_metadata(extensions)), media_type=JSON)

    async def model_meta(request: Request) -> Response:
        import json

        if not _authorised(state, request):
            return _error(401, "missing or wrong bearer token")
        try:
            svc, _ = service_for(request)
        except ProtocolError as exc:
            return _error(exc.status, str(exc))
        meta = model_metadata(svc.name, svc.ladder, "latencylab", svc.inputs, svc.outputs)
        meta["parameters"] = _ladder_parameters(svc)
        return Response(json.dumps(meta), media_type=JSON)

    async def model_ready(request: Request) -> Response:
        if not _authorised(state, request):
            return _error(401, "missing or wrong bearer token")
        try:
            service_for(request)
        except ProtocolError as exc:
            return _error(exc.status, str(exc))
        return Response(
            b'{"ready":%s}' % (b"true" if state.ready else b"false"), 200 if state.ready else 503, media_type=JSON
        )

    async def infer(request: Request) -> Response:
        start = now_ns()
        epoch0 = time.time_ns()
        timing = Timing(start)
        if not _authorised(state, request):
            return _error(401, "missing or wrong bearer token")
        model = request.path_params.get("model", "?")
        hook: DisconnectHook | None = request.scope.get("extensions", {}).get(DISCONNECT)
        try:
            svc, version = service_for(request)
            stamp = request.headers.get(REQUEST_START_HEADER) if state.cfg.trust_request_start else None
            if stamp is not None:  # wall clock read once, at handler start: the age moves to the clock
                timing.age_ns = request_age_ns(stamp, epoch0)
                state.metrics.request_age.labels(svc.name).observe(timing.age_ns / 1e9)
            body = await _read_body(request, state.cfg.max_body_bytes, state.limits.body_timeout_s)
            pinned = svc.ladder.index(version) if version is not None and version != "cache" else None
            # Refused from its headers before its body is decoded (serve/early.py): under overload most requests
            # are refused, and decoding them all took the core the compute needs.
            refused = early_refusal(svc, timing, now_ns(), pinned, body, request.headers, DEADLINE_HEADER)
            if refused is not None:
                raise refused
            req, output_format = decode_infer_request(body, svc.name, version, svc.inputs, headers=request.headers)
            header_deadline = request.headers.get(DEADLINE_HEADER)
            if header_deadline is not None and "deadline_ms" not in req.parameters:
                deadline_ms = deadline_from_header(header_deadline, DEADLINE_HEADER)
                req = dataclasses.replace(req, parameters={**req.parameters, "deadline_ms": deadline_ms})
            check_requested_outputs(req.outputs, svc.outputs)
            timing.parsed = now_ns()
            if hook is None:  # no disconnect notice (an ASGI server other than ours, a test client)
                resp, params = await svc.infer(req, timing, pinned)
            else:
                # A client that leaves cancels its request (service.py takes it out of the preprocess pool's
                # backlog and the batcher's queue; only a batch already computing finishes): the handler's own
                # task is cancelled (a task of its own for the inference cost a pass of the loop to start and
                # another to wake the handler once it was done).
                me = asyncio.current_task()
                assert me is not None
                hook.add(me.cancel)
                try:
                    resp, params = await svc.infer(req, timing, pinned)
                finally:
                    hook.remove(me.cancel)
            payload, json_length = encode_infer_body(resp, req.outputs, output_format)
            svc.answered(timing, now_ns())
        except asyncio.CancelledError:
            if hook is None or not hook.gone:
                raise  # the handler itself was cancelled (shutdown), not its client gone
            if model in state.services:
                state.metrics.requests.labels(model, "-", "499").inc()
            return _error(499, "client closed the connection")  # nobody reads it
        except _ClientGone as exc:
            log.info("%s %s: %s", request.method, request.url.path, exc)
            if model in state.services:
                state.metrics.requests.labels(model, "-", "499").inc()
            return _error(499, str(exc))
        except ProtocolError as exc:
            if model in state.services:
                state.metrics.errors.labels(model, "bad_input").inc()
            return _error(exc.status, str(exc))
        except ServiceError as exc:
            state.metrics.errors.labels(model, exc.kind or "other").inc() if exc.kind != "shed" else None
            state.metrics.requests.labels(model, "-", str(exc.status)).inc()
            return _error(exc.status, str(exc), exc.retry_after_s)
        except Exception as exc:  # a bug, not the client's fault: counted, logged with its traceback, JSON 500
            log.exception("unexpected error serving %s %s", request.method, request.url.path)
            if model in state.services:
                state.metrics.errors.labels(model, "internal").inc()
                state.metrics.requests.labels(model, "-", "500").inc()
            return _error(500, f"internal server error ({type(exc).__name__})")
        end = now_ns()
        o = timing.outcome
        stages: list[tuple[str, float]] = [("request", (end - start) / 1e9)]
        if o is not None:
            stages += [
                ("preprocess", (timing.preprocessed - timing.parsed) / 1e9 + o.preprocess_s),
                ("queue", o.queue_s),
                ("batch", o.batch_s),
                ("compute", o.compute_s),
                ("postprocess", o.postprocess_s),
            ]
        state.metrics.observe_stages(svc.name, stages)
        state.metrics.requests.labels(svc.name, str(params.get("producer")), "200").inc()
        if state.tracer.enabled:
            _trace(state, request, epoch0, start, timing, end, params)
        if json_length is None:
            return Response(payload, media_type=JSON)
        # Binary tensor data follows the JSON: the header says where the JSON ends.
        headers = {BINARY_HEADER: str(json_length)}
        return Response(payload, media_type="application/octet-stream", headers=headers)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_meta),
        Route("/v2/models/{model}", model_meta),
        Route("/v2/models/{model}/versions/{version}", model_meta),
        Route("/v2/models/{model}/ready", model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", model_ready),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/metrics", metrics),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own refusals (no route, wrong method, ...) as JSON, keeping their headers (405's Allow)."""
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            if "Allow" in headers:  # Starlette joins a set: its order changes with the process's hash seed
                headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
            message = f"method {request.method} not allowed on {request.url.path} (allowed: {headers.get('Allow')})"
        else:
            message = str(exc.detail)
        return _error(exc.status_code, message, headers=headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        """Anything unexpected outside a handler's own catch: a JSON 500, never Starlette's plain text. (Starlette
        re-raises the exception after this answer, so the server still logs its traceback.)"""
        return _error(500, f"internal server error ({type(exc).__name__})")

    handlers = {HTTPException: http_error, Exception: internal_error}
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)


def _ladder_parameters(svc: ModelService) -> dict[str, Any]:
    """Model metadata's ``parameters``: what fills each rung of the ladder, in order (``ladder``), and for a
    ladder read off an optimize run (``serve --from``), each rung's measured p50 and fidelity, where it came
    from (``source``) and the rungs the search could not fill (``absent``)."""
    ladder: list[dict[str, Any]] = []
    for v in svc.variants:
        rung: dict[str, Any] = {"version": v.name, "rung": v.kind}
        description = getattr(v, "description", "")
        if description:
            rung["description"] = description
        rung.update(getattr(v, "provenance", None) or {})
        ladder.append(rung)
    if "cache" in svc.ladder:
        ladder.append({"version": "cache", "rung": "cache", "description": "the result cache (alarm raised)"})
    return {"ladder": ladder, **(getattr(svc.variants[0], "ladder_info", None) or {})}


def _trace(
    state: ServerState, request: Request, epoch0: int, start: int, t: Timing, end: int, params: dict[str, Any]
) -> None:
    def ep(ns: int) -> int:
        return epoch0 + (ns - start)

    spans = [("receive", ep(start), ep(t.parsed or start))]
    o = t.outcome
    if o is not None and t.preprocessed:
        q0 = t.preprocessed
        q1 = q0 + int(o.queue_s * 1e9)
        b1 = q1 + int(o.batch_s * 1e9)
        c1 = b1 + int(o.compute_s * 1e9)
        p1 = c1 + int(o.postprocess_s * 1e9)
        spans += [
            ("preprocess", ep(t.parsed), ep(q0)),
            ("queue", ep(q0), ep(q1)),
            ("batch", ep(q1), ep(b1)),
            ("compute", ep(b1), ep(c1)),
            ("postprocess", ep(c1), ep(p1)),
            ("send", ep(p1), ep(end)),
        ]
    attrs = {f"latencylab.{k}": v for k, v in params.items() if isinstance(v, str | int | float | bool)}
    state.tracer.emit(dict(request.headers), ep(start), ep(end), spans, attrs)


def build_state(
    cfg: ServerConfig,
    variants_by_model: Mapping[str, Sequence[Variant]],
    tracer_provider: Any = None,
    preprocess_threads: int | None = None,
    clock: Clock | None = None,
) -> ServerState:
    """Services with warmed batchers for every model in ``cfg`` (blocking: runs the warm-up).

    ``clock``: what every service, batcher and guard reads the time from (``perf_counter_ns`` by default;
    tests pass a ``FakeClock``)."""
    from latencylab.serve.guard import webhook_notifier

    clock = clock if clock is not None else PerfCounterClock()
    metrics = ServerMetrics({m.name: m.slo_ms / 1e3 for m in cfg.models})
    n_pre = cfg.preprocess_threads if preprocess_threads is None else preprocess_threads
    pool = concurrent.futures.ThreadPoolExecutor(n_pre, thread_name_prefix="preprocess") if n_pre > 0 else None
    hook = webhook_notifier(cfg.webhook) if cfg.webhook else None
    services = {}
    for m in cfg.models:
        svc = ModelService(m, variants_by_model[m.name], metrics, pool, hook, compute_threads=cfg.threads, clock=clock)
        svc.warmup()
        metrics.ladder_level.labels(m.name).set(0)
        metrics.alarm.labels(m.name).set(0)
        metrics.slo_target.labels(m.name).set(m.slo_target_fraction)
        services[m.name] = svc
    token = os.environ.get(cfg.token_env) if cfg.token_env else None
    if cfg.token_env and not token:
        from latencylab.errors import LatencyLabError

        raise LatencyLabError(f"token_env {cfg.token_env!r} is set in the config but the variable is empty")
    if tracer_provider is None and cfg.otlp_endpoint:
        from latencylab.serve.tracing import make_tracer_provider

        tracer_provider = make_tracer_provider(cfg.otlp_endpoint)
    from latencylab.serve.tracing import RequestTracer

    return ServerState(cfg, services, metrics, RequestTracer(tracer_provider), token, clock=clock)


@contextlib.contextmanager
def gc_pauses_observed(metrics: ServerMetrics) -> Iterator[None]:
    """Every garbage collection while serving, timed into ``latencylab_server_gc_pause_seconds`` (gc.callbacks).
    A collection stops every thread: one that walks the model's objects shows as a gap in every answer."""
    started: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter_ns()]
        elif started:
            took = (time.perf_counter_ns() - started[0]) / 1e9
            metrics.gc_pause.labels(str(info.get("generation", "?"))).observe(took)
            started.clear()

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(callback)


def lifespan_app(state: ServerState) -> Starlette:
    """The app with batchers started on startup and stopped (after uvicorn drained requests) on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for svc in state.services.values():
            await svc.start()
        with contextlib.ExitStack() as stack:
            stack.enter_context(gc_pauses_observed(state.metrics))
            if state.cfg.gc_freeze:
                from latencylab.gcpause import frozen

                stack.enter_context(frozen())
                state.metrics.gc_frozen.set(gc.get_freeze_count())
                log.info("froze %d objects left by start-up and warm-up (gc.freeze)", gc.get_freeze_count())
            state.ready = True
            try:
                yield
            finally:
                state.ready = False
                for svc in state.services.values():
                    await svc.stop()

    return build_app(state, lifespan)


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this on Linux: uvicorn writes the response head and body separately, and
    # with Nagle on the body waits for the client's delayed ACK (~40 ms on loopback).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def uvicorn_config(state: ServerState, head_refusal: bool = True) -> Any:
    """The ``uvicorn.Config`` the server runs: httptools with ``state.limits`` on request heads (431 past
    ``max_head_bytes``, 408 past ``head_timeout_s``: serve/limits.py) and ``keep_alive_s`` idle connections;
    with ``head_refusal``, admission's refusals answered by the connection from the request's head
    (serve/head_refusal.py; off: every request goes to the app, which refuses before decoding, serve/early.py)."""
    import uvicorn

    from latencylab.serve.head_refusal import HeadRefuser

    refuser = HeadRefuser(state, DEADLINE_HEADER) if head_refusal else None

    return uvicorn.Config(
        lifespan_app(state),
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http=guarded_protocol(state.limits, refuser),
        timeout_keep_alive=state.limits.keep_alive_s,
        timeout_graceful_shutdown=30,
        lifespan="on",
    )


def run_server(
    state: ServerState, on_listening: Any = None, head_refusal: bool = True, loop: str | None = None
) -> None:
    """Serve until SIGTERM/SIGINT; in-flight requests are drained (uvicorn's graceful shutdown).

    The event loop is the config's (uvloop; ``loop="asyncio"``: the standard one). Until session 13 this function
    ran ``asyncio.run``, so the config's ``loop="uvloop"`` was never applied (uvicorn applies it only in
    ``Server.run``): every request's hand-offs between the loop, the preprocess pool and the compute thread
    went through the standard loop."""
    import uvicorn

    sock = bind(state.cfg.host, state.cfg.port)
    config = uvicorn_config(state, head_refusal)
    if loop is not None:
        config.loop = loop

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Drain and exit 0: uvicorn would re-raise the captured SIGTERM after its graceful shutdown,
            # making a clean drain look like a kill to supervisors.
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    server = _Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if on_listening is not None and server.started:
            on_listening(sock.getsockname()[1])
        await task

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve())

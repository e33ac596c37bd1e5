"""A reference streaming (generative) endpoint with a known token-time law: ground truth for token metrics.

Every request streams exactly ``max_tokens`` tokens: the first ``ttft`` after the request was read, each
next one a ``gap`` after the previous, both drawn (seeded) from stated distributions; tokens are written on
an absolute schedule, so a late wake-up delays one token and not the rest. Optional faults make the bad cases
reproducible: a stall (every K-th stream pauses once, mid-stream), and every K-th request answered wrongly
(closed early, an error event, a non-SSE answer). A concurrency limit sheds with 429. ``slots`` makes it a
queue with a finite capacity: at most that many streams generate at once, the others wait their turn (FIFO)
and the wait is part of their TTFT, so with constant laws the server is an M/D/c queue whose service time is
``ttft + (max_tokens - 1) * gap``. Every draw is recorded and served at ``GET /debug/draws`` (``ttft_ns``,
``gaps_ns`` including any stall, ``fault``, ``queued_ns``: the wait for a slot).

Protocols: OpenAI ``POST /v1/completions`` and ``/v1/chat/completions`` (``stream: true`` SSE, an optional
usage event with ``stream_options.include_usage``, ``data: [DONE]``; without ``stream`` one JSON answer),
``GET /v1/models``, and OIP ``POST /v2/models/{m}/generate_stream`` (SSE ``text_output`` events) and
``/generate`` (one JSON answer). ``max_tokens`` below 1 is answered 400 as OpenAI does.

Run it in its own process, so it never shares the generator's GIL::

    python -m latencylab.load.reference_stream_server --port 0 --ttft "lognormal(200ms,0.3)" \\
        --gap "lognormal(40ms,0.3)" --stall-every 4 --stall 500ms --fault close@7
    # prints "listening http://127.0.0.1:PORT" and serves until SIGTERM / SIGINT
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.load.reference_server import ReferenceHandler, ReferenceServer, serve_until_stopped
from latencylab.workloads.synthetic import Distribution, parse_duration_ns

MODEL = "reference"
MAX_BODY = 1024 * 1024
FAULTS = ("close", "error", "nonsse")
_OIP = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(generate|generate_stream)$")


def parse_fault(text: str) -> tuple[str, int]:
    """``KIND@K``: every K-th request (1-based count) gets fault KIND (close, error, nonsse)."""
    kind, sep, every = text.partition("@")
    if kind not in FAULTS or not sep or not every.isdigit() or int(every) < 1:
        raise LatencyLabError(f"fault {text!r} must be KIND@K with KIND one of {', '.join(FAULTS)}, K >= 1")
    return kind, int(every)


class StreamState:
    def __init__(
        self,
        ttft: Distribution,
        gap: Distribution,
        seed: int = 0,
        stall_every: int | None = None,
        stall_ns: int = 0,
        faults: tuple[tuple[str, int], ...] = (),
        max_inflight: int | None = None,
        slots: int | None = None,
    ) -> None:
        self.ttft, self.gap = ttft, gap
        self.rng = np.random.default_rng(seed)
        self.stall_every, self.stall_ns = stall_every, stall_ns
        self.faults = faults
        self.max_inflight = max_inflight
        self.lock = threading.Lock()
        self.count = 0
        self.inflight = 0
        self.draws: list[dict[str, Any]] = []
        self.free = slots  # None: no queue, every admitted stream generates at once
        self.waiting: deque[threading.Event] = deque()

    def acquire_slot(self) -> int:
        """Wait (FIFO) for a generation slot; the ns waited."""
        if self.free is None:
            return 0
        t0 = time.perf_counter_ns()
        with self.lock:
            if self.free > 0 and not self.waiting:
                self.free -= 1
                return 0
            turn = threading.Event()
            self.waiting.append(turn)
        turn.wait()  # release() hands its slot straight to the first in line: no barging
        return time.perf_counter_ns() - t0

    def release_slot(self) -> None:
        if self.free is None:
            return
        with self.lock:
            if self.waiting:
                self.waiting.popleft().set()
            else:
                self.free += 1

    def admit(self, n_tokens: int) -> dict[str, Any] | None:
        """The draw for a request arriving now (None: shed), recorded in ``draws``."""
        with self.lock:
            if self.max_inflight is not None and self.inflight >= self.max_inflight:
                return None
            self.inflight += 1
            self.count += 1
            k = self.count
            ttft = int(self.ttft.sample(self.rng, 1)[0])
            gaps = [int(g) for g in self.gap.sample(self.rng, max(n_tokens - 1, 0))]
            if self.stall_every and k % self.stall_every == 0 and gaps:
                gaps[len(gaps) // 2] += self.stall_ns
            fault = next((kind for kind, every in self.faults if k % every == 0), "")
            draw = {"request": k, "ttft_ns": ttft, "gaps_ns": gaps, "fault": fault}
            self.draws.append(draw)
        return draw

    def release(self) -> None:
        with self.lock:
            self.inflight -= 1


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: Any) -> bytes:
    return _chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")


def make_handler(state: StreamState) -> type[BaseHTTPRequestHandler]:
    class Handler(ReferenceHandler):
        def _error(self, code: int, message: str) -> None:
            self._send(code, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/debug/draws":
                with state.lock:
                    self._send(200, list(state.draws))
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            elif path in ("/health", "/v2/health/ready", "/v2/health/live"):
                self._send(200, {})
            else:
                self._send(404, {"error": f"no route {path}"})

        def do_POST(self) -> None:
            t_recv = time.perf_counter_ns()
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._error(413, "request body too large")
                self.close_connection = True
                return
            raw = self.rfile.read(length)
            path = self.path.split("?")[0]
            oip = _OIP.match(path)
            if path not in ("/v1/completions", "/v1/chat/completions") and not oip:
                self._send(404, {"error": f"no route {path}"})
                return
            try:
                req = json.loads(raw)
                params = req.get("parameters", {}) if oip else req
                max_tokens = params.get("max_tokens", 16)
            except (ValueError, AttributeError):
                self._error(400, "malformed request: expected a JSON object")
                return
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                self._error(400, f"max_tokens must be at least 1, got {max_tokens!r}")
                return
            if oip and oip.group(1) != MODEL:
                self._send(404, {"error": f"unknown model {oip.group(1)!r}"})
                return
            draw = state.admit(max_tokens)
            if draw is None:
                self._send(429, {"error": {"message": "too many requests in flight"}}, {"Retry-After": "1"})
                return
            queued = state.acquire_slot()
            draw["queued_ns"] = queued
            t_recv += queued
            try:
                if oip:
                    self._oip(draw, t_recv, oip.group(2) == "generate_stream")
                else:
                    chat = path.endswith("chat/completions")
                    usage = bool((req.get("stream_options") or {}).get("include_usage"))
                    self._openai(draw, t_recv, chat, bool(req.get("stream")), usage)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            finally:
                state.release_slot()
                state.release()

        def _times(self, draw: dict[str, Any], t_recv: int) -> list[int]:
            """Absolute perf_counter_ns of each token (the schedule, not the accumulated sleeps)."""
            return list(np.cumsum([t_recv + draw["ttft_ns"], *draw["gaps_ns"]]).tolist())

        @staticmethod
        def _wait(t_ns: int) -> None:
            dt = t_ns - time.perf_counter_ns()
            if dt > 0:
                time.sleep(dt / 1e9)

        def _fault(self, draw: dict[str, Any], error_end: bytes) -> bool:
            """Inject the draw's mid-stream fault, if any: cut the connection, or end the stream with
            ``error_end`` (an error event and the stream's end). Whether the stream ended."""
            if draw["fault"] == "close":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return True
            if draw["fault"] == "error":
                self.wfile.write(error_end)
                return True
            return False

        def _one_shot(self, draw: dict[str, Any], t_recv: int, obj: Any) -> None:
            self._wait(self._times(draw, t_recv)[-1])
            self._send(200, obj)

        def _openai(self, draw: dict[str, Any], t_recv: int, chat: bool, stream: bool, usage: bool) -> None:
            times = self._times(draw, t_recv)
            n = len(times)
            base = {"id": f"cmpl-{draw['request']}", "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": MODEL}  # fmt: skip
            if not stream or draw["fault"] == "nonsse":
                text = "".join(f"tok{i} " for i in range(n))
                choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {
                    "index": 0, "text": text}  # fmt: skip
                self._one_shot(draw, t_recv, {**base, "choices": [{**choice, "finish_reason": "length"}],
                                              "usage": {"completion_tokens": n}})  # fmt: skip
                return
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            if chat:  # the role event OpenAI sends first: no text, not a token
                self.wfile.write(_event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
            error = {"error": {"message": "injected failure mid-stream", "type": "server_error"}}
            error_end = _event(error) + _event(b"[DONE]") + _chunk(b"")
            for i, t in enumerate(times):
                self._wait(t)
                if i == n // 2 and self._fault(draw, error_end):
                    return
                text = f"tok{i} "
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                last = i == n - 1
                out = _event({**base, "choices": [{**choice, "finish_reason": "length" if last else None}]})
                if last:  # the end leaves with the last token: E2E - TTFT is the token schedule's
                    if usage:
                        out += _event({**base, "choices": [], "usage": {"completion_tokens": n}})
                    out += _event(b"[DONE]") + _chunk(b"")
                self.wfile.write(out)

        def _oip(self, draw: dict[str, Any], t_recv: int, stream: bool) -> None:
            times = self._times(draw, t_recv)
            n = len(times)
            if not stream or draw["fault"] == "nonsse":
                text = "".join(f"tok{i} " for i in range(n))
                self._one_shot(draw, t_recv, {"model_name": MODEL, "text_output": text})
                return
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for i, t in enumerate(times):
                self._wait(t)
                if i == n // 2 and self._fault(draw, _event({"error": "injected failure mid-stream"}) + _chunk(b"")):
                    return
                out = _event({"model_name": MODEL, "text_output": f"tok{i} "})
                self.wfile.write(out + (_chunk(b"") if i == n - 1 else b""))

    return Handler


class StreamServer(ReferenceServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that went away (or a stream this server cut on purpose) is not worth a traceback
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def serve(
    port: int = 0,
    ttft: str = "lognormal(200ms,0.3)",
    gap: str = "lognormal(40ms,0.3)",
    seed: int = 0,
    stall_every: int | None = None,
    stall: str = "0s",
    faults: tuple[str, ...] = (),
    max_inflight: int | None = None,
    slots: int | None = None,
) -> StreamServer:
    state = StreamState(
        Distribution.parse(ttft), Distribution.parse(gap), seed, stall_every, int(parse_duration_ns(stall)),
        tuple(parse_fault(f) for f in faults), max_inflight, slots,
    )  # fmt: skip
    return StreamServer(("127.0.0.1", port), make_handler(state))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m latencylab.load.reference_stream_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft", default="lognormal(200ms,0.3)", help="time to the first token (from the read)")
    ap.add_argument("--gap", default="lognormal(40ms,0.3)", help="time between consecutive tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stall-every", type=int, default=None, help="every K-th stream pauses once mid-stream")
    ap.add_argument("--stall", default="0s", help="how long that pause lasts, e.g. 500ms")
    ap.add_argument("--fault", action="append", default=[], help="KIND@K: close, error or nonsse every K-th request")
    ap.add_argument("--max-inflight", type=int, default=None, help="shed with 429 beyond this")
    ap.add_argument("--slots", type=int, default=None, help="at most this many streams at once; the rest queue")
    args = ap.parse_args(argv)
    if args.slots is not None and args.slots < 1:
        print("error: --slots must be >= 1", file=sys.stderr)
        return 2
    try:
        server = serve(args.port, args.ttft, args.gap, args.seed, args.stall_every, args.stall, tuple(args.fault),
                       args.max_inflight, args.slots)  # fmt: skip
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve_until_stopped(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())

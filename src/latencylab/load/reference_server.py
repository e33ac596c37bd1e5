"""A reference Open Inference Protocol endpoint with a known service-time distribution.

The ground truth the load generator is verified against (and a handy target
for checking a load set-up): every infer request sleeps for a service time
drawn, seeded, from a stated distribution; an optional stall freezes the whole
server for a while (requests arriving during it wait until it ends), and an
optional concurrency limit sheds with 503 + Retry-After. It records every
service time it drew, and exposes Prometheus metrics in latencylab's naming.

Run it in its own process so it does not share the generator's GIL::

    python -m latencylab.load.reference_server --port 0 --service "lognormal(50ms,0.3)" \\
        --stall-at 5 --stall 1s
    # prints "listening http://127.0.0.1:PORT" and serves until SIGTERM / SIGINT

``GET /debug/service_times`` returns the drawn service times (ns) as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from latencylab.workloads.synthetic import Distribution, parse_duration_ns

MODEL = "reference"
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
MAX_BODY = 8 * 1024 * 1024


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, s: float) -> None:
        i = next((k for k, b in enumerate(BUCKETS_S) if s <= b), len(BUCKETS_S))
        self.counts[i] += 1
        self.sum += s
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cum = [], 0
        for b, c in zip(BUCKETS_S, self.counts, strict=False):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{b:g}"}} {cum}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.9f}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


class ReferenceState:
    def __init__(
        self,
        service: Distribution,
        seed: int = 0,
        stall_at_s: float | None = None,
        stall_s: float = 0.0,
        max_inflight: int | None = None,
        serial: bool = False,
    ) -> None:
        self.service = service
        # serial: one request computes at a time (a single-worker server, an M/G/1 queue), so capacity is
        # 1 / mean service time and queueing shows up as latency.
        self.compute_lock: threading.Lock | None = threading.Lock() if serial else None
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.stall_at_s = stall_at_s
        self.stall_s = stall_s
        self.max_inflight = max_inflight
        self.first_request: float | None = None
        self.inflight = 0
        self.drawn: list[int] = []
        self.shed = 0
        self.stages = {"queue": _Histogram(), "compute": _Histogram(), "request": _Histogram()}

    def admit(self) -> tuple[bool, int, float]:
        """(admitted, service ns, stall wait s) for a request arriving now."""
        now = time.perf_counter()
        with self.lock:
            if self.first_request is None:
                self.first_request = now
            if self.max_inflight is not None and self.inflight >= self.max_inflight:
                self.shed += 1
                return False, 0, 0.0
            self.inflight += 1
            ns = int(self.service.sample(self.rng, 1)[0])
            self.drawn.append(ns)
        wait = 0.0
        if self.stall_at_s is not None:
            start = self.first_request + self.stall_at_s
            if start <= now < start + self.stall_s:
                wait = start + self.stall_s - now
        return True, ns, wait

    def release(self, queue_s: float, compute_s: float, total_s: float) -> None:
        with self.lock:
            self.inflight -= 1
            self.stages["queue"].observe(queue_s)
            self.stages["compute"].observe(compute_s)
            self.stages["request"].observe(total_s)

    def metrics(self) -> str:
        with self.lock:
            lines = [
                "# HELP latencylab_server_stage_seconds Server-side time per stage.",
                "# TYPE latencylab_server_stage_seconds histogram",
            ]
            for stage, h in self.stages.items():
                lines += h.lines("latencylab_server_stage_seconds", f'model="{MODEL}",stage="{stage}"')
            lines += [
                "# TYPE latencylab_server_shed_total counter",
                f'latencylab_server_shed_total{{model="{MODEL}",reason="concurrency"}} {self.shed}',
                "# TYPE latencylab_server_in_flight gauge",
                f'latencylab_server_in_flight{{model="{MODEL}"}} {self.inflight}',
            ]
        return "\n".join(lines) + "\n"


_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
_META = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?(/ready)?$")


class ReferenceHandler(BaseHTTPRequestHandler):
    """The HTTP/1.1 handler both reference servers build on: no request log, Nagle off, one write per answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body (or each streamed event) go out in one write, and with Nagle off: otherwise a small
        # write waits for the client's delayed ACK (~40 ms) and the "server" looks 40 ms slower than it is.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, code: int, obj: Any, extra: dict[str, str] | None = None, ctype: str = "application/json") -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        head = [
            f"HTTP/1.1 {code} {HTTPStatus(code).phrase}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


def make_handler(state: ReferenceState) -> type[BaseHTTPRequestHandler]:
    class Handler(ReferenceHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/v2/health/live", "/v2/health/ready"):
                self._send(200, {})
            elif path == "/v2":
                self._send(200, {"name": "latencylab-reference", "version": "1", "extensions": []})
            elif path == "/metrics":
                self._send(200, state.metrics().encode(), ctype="text/plain; version=0.0.4")
            elif path == "/debug/service_times":
                with state.lock:
                    self._send(200, list(state.drawn))
            elif m := _META.match(path):
                if m.group(1) != MODEL:
                    self._send(404, {"error": f"unknown model {m.group(1)!r}"})
                elif m.group(2):
                    self._send(200, {})
                else:
                    self._send(
                        200,
                        {
                            "name": MODEL,
                            "versions": ["1"],
                            "platform": "latencylab-reference",
                            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
                            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 1]}],
                        },
                    )
            else:
                self._send(404, {"error": f"no route {path}"})

        def do_POST(self) -> None:
            t_recv = time.perf_counter()
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(413, {"error": "request body too large"}, {"Connection": "close"})
                self.close_connection = True
                return
            raw = self.rfile.read(length)
            m = _INFER.match(self.path)
            if not m:
                self._send(404, {"error": f"no route {self.path}"})
                return
            if m.group(1) != MODEL:
                self._send(404, {"error": f"unknown model {m.group(1)!r}"})
                return
            try:
                req = json.loads(raw)
                inputs = req["inputs"]
            except (ValueError, KeyError, TypeError):
                self._send(400, {"error": "malformed infer request: expected JSON with 'inputs'"})
                return
            admitted, ns, wait = state.admit()
            if not admitted:
                self._send(503, {"error": "overloaded"}, {"Retry-After": "1"})
                return
            if wait > 0:
                time.sleep(wait)
            if state.compute_lock is not None:
                with state.compute_lock:
                    t_start = time.perf_counter()
                    time.sleep(ns / 1e9)
                    t_end = time.perf_counter()
            else:
                t_start = time.perf_counter()
                time.sleep(ns / 1e9)
                t_end = time.perf_counter()
            out = {
                "model_name": MODEL,
                "model_version": "1",
                "id": req.get("id", ""),
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 1], "data": [len(inputs)]}],
            }
            self._send(200, out)
            state.release(t_start - t_recv, t_end - t_start, time.perf_counter() - t_recv)

    return Handler


class ReferenceServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def serve_until_stopped(server: ThreadingHTTPServer) -> None:
    """Print ``listening URL`` (the line test harnesses wait for) and serve until SIGTERM or SIGINT."""
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.05)
    server.server_close()


def serve(
    port: int = 0,
    service: str = "lognormal(20ms,0.3)",
    seed: int = 0,
    stall_at_s: float | None = None,
    stall: str = "0s",
    max_inflight: int | None = None,
    serial: bool = False,
) -> ReferenceServer:
    state = ReferenceState(
        Distribution.parse(service), seed, stall_at_s, parse_duration_ns(stall) / 1e9, max_inflight, serial
    )
    return ReferenceServer(("127.0.0.1", port), make_handler(state))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m latencylab.load.reference_server", description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--service", default="lognormal(20ms,0.3)", help="service-time distribution")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stall-at", type=float, default=None, help="seconds after the first request")
    ap.add_argument("--stall", default="0s", help="how long the server freezes, e.g. 1s")
    ap.add_argument("--max-inflight", type=int, default=None, help="shed with 503 beyond this")
    ap.add_argument("--serial", action="store_true", help="one request computes at a time (M/G/1)")
    args = ap.parse_args(argv)
    server = serve(args.port, args.service, args.seed, args.stall_at, args.stall, args.max_inflight, args.serial)
    serve_until_stopped(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())

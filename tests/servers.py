"""Servers for tests: latencylab's reference servers in their own processes (so they never share the
generator's GIL), latencylab's own server in a thread, and a recording HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np


@contextmanager
def module_server(module: str, *args: str) -> Iterator[str]:
    """``python -m module --port 0 *args`` in its own process; yields the URL from its ``listening URL`` line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening "):
            raise RuntimeError(f"{module} did not start: {line} {proc.stderr.read() if proc.stderr else ''}")
        yield line.split(" ", 1)[1]
    finally:
        stop(proc, 10.0)


def stop(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, up to ``grace_s`` to exit, then SIGKILL; the process is reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def reference_server(*args: str) -> AbstractContextManager[str]:
    return module_server("latencylab.load.reference_server", *args)


def stream_server(*args: str) -> AbstractContextManager[str]:
    """The reference streaming server (latencylab.load.reference_stream_server)."""
    return module_server("latencylab.load.reference_stream_server", *args)


@contextmanager
def uvicorn_thread(state: Any, config: Any = None) -> Iterator[tuple[str, int]]:
    """A real uvicorn server (the config ``run_server`` uses, or ``config``) serving ``state`` in a thread, on
    loopback; yields its (host, port)."""
    import asyncio
    import threading
    import time

    import uvicorn

    from latencylab.serve.app import bind, uvicorn_config

    server = uvicorn.Server(config if config is not None else uvicorn_config(state))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    give_up = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < give_up:
        time.sleep(0.01)
    assert server.started, "server did not start"
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)


def drawn_service_times(url: str) -> np.ndarray:
    with urllib.request.urlopen(f"{url}/debug/service_times", timeout=10) as resp:
        return np.asarray(json.loads(resp.read()), dtype=np.int64)


@contextmanager
def recording_server() -> Iterator[tuple[str, list[tuple[str | None, int]]]]:
    """A tiny HTTP server in a thread answering every POST with 200 ``{}`` and recording, per request,
    its ``X-Request-Start`` value (None without one) and ``time.time_ns()`` when its head was read."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str | None, int]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            received = time.time_ns()
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                seen.append((self.headers.get("X-Request-Start"), received))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

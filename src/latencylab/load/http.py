"""A minimal, fast HTTP/1.1 keep-alive client on asyncio protocols, for the load generator.

Why not aiohttp/httpx: a load generator's own overhead is part of what it
measures. This client pre-encodes each request once, writes it with one
``transport.write`` and parses the response inside ``data_received``, calling
the completion callback synchronously with the timestamp of the last byte: no
task, future or coroutine per request. It speaks exactly what Open Inference
Protocol servers answer: status line, headers, a ``Content-Length`` or
chunked body.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from latencylab.errors import LatencyLabError


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise LatencyLabError(f"target {url!r} must be an http://host:port URL (https is not supported)")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise LatencyLabError(f"target {url!r} has an invalid port") from exc
        return cls(parts.hostname, port, parts.path.rstrip("/"))


def build_request(
    target: Target, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """The full request bytes, built once and reused."""
    lines = [f"{method} {target.base_path}{path} HTTP/1.1", f"Host: {target.host}:{target.port}"]
    if body or method == "POST":
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


REQUEST_START_HEADER = "X-Request-Start"
STAMP_DIGITS = 16  # unix microseconds have 16 digits from 2001 to 2286


def build_stamped_request(
    target: Target, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[bytes, int]:
    """``build_request`` with ``X-Request-Start: t=<16 digits>`` (zeros), and the offset of those digits.

    ``stamp`` writes a time into a copy at send time, so a request is encoded once and not per send."""
    request = build_request(
        target, method, path, body, {**(headers or {}), REQUEST_START_HEADER: "t=" + "0" * STAMP_DIGITS}
    )
    offset = request.index(f"\r\n{REQUEST_START_HEADER}: t=".encode()) + len(REQUEST_START_HEADER) + 6
    return request, offset


def stamp(template: bytes, offset: int, unix_us: int) -> bytes:
    """A copy of ``template`` (from ``build_stamped_request``) stating ``unix_us`` in its X-Request-Start."""
    out = bytearray(template)
    out[offset : offset + STAMP_DIGITS] = b"%016d" % unix_us
    return bytes(out)


# Completion callback: (status, headers, body, done_ns, ctx). status 0 = transport error (body holds the reason).
OnDone = Callable[[int, dict[str, str], bytes, int, Any], None]


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    __slots__ = ("_buf", "_ctx", "_on_done", "_pool", "busy", "closed", "transport")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._ctx: Any = None
        self._on_done: OnDone | None = None
        self.busy = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, request: bytes, ctx: Any, on_done: OnDone) -> None:
        self.busy = True
        self._ctx = ctx
        self._on_done = on_done
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail("malformed HTTP status line")
            return
        headers: dict[str, str] = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        start = head_end + 4
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(buf) < start + n:
                return
            body = bytes(buf[start : start + n])
            del buf[: start + n]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = _parse_chunked(buf, start)
            if parsed is None:
                return
            body, end = parsed
            del buf[:end]
        else:
            self._fail("response without Content-Length")
            return
        done = time.perf_counter_ns()
        cb, ctx = self._on_done, self._ctx
        self._on_done = None
        self._ctx = None
        self.busy = False
        keep = headers.get("connection", "").lower() != "close"
        if keep:
            self._pool.release(self)
        elif self.transport is not None:
            self.closed = True
            self.transport.close()
        if cb is not None:
            cb(status, headers, body, done, ctx)

    def _fail(self, reason: str) -> None:
        cb, ctx = self._on_done, self._ctx
        self._on_done = None
        self._ctx = None
        self.busy = False
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if cb is not None:
            cb(0, {}, reason.encode(), time.perf_counter_ns(), ctx)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._on_done is not None:
            self._fail(f"connection lost: {exc or 'closed by server'}")

    def abort(self, reason: str) -> None:
        """Give up on the in-flight request (timeout): report it and drop the connection."""
        self._fail(reason)


def _parse_chunked(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n", pos)
            return (bytes(out), end + 2) if end >= 0 else None
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


class ConnectionPool:
    """Idle keep-alive connections to one target; opens more when all are busy (open loop needs that)."""

    def __init__(
        self,
        target: Target,
        max_connections: int = 2048,
        factory: Callable[[ConnectionPool], Connection] | None = None,
    ) -> None:
        self.target = target
        self.max_connections = max_connections
        # what each connection speaks: plain request/response (Connection) or a token stream (sse.StreamConnection)
        self._factory: Callable[[ConnectionPool], Connection] = factory or Connection
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self.opened = 0

    @property
    def size(self) -> int:
        return len(self._all)

    async def open(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: self._factory(self), self.target.host, self.target.port)
        except OSError as exc:
            raise ConnectionError(
                f"cannot connect to {self.target.host}:{self.target.port}: {exc.strerror or exc}"
            ) from exc
        self._all.add(conn)
        self.opened += 1
        return conn

    async def warm(self, n: int) -> None:
        conns = [await self.open() for _ in range(n)]
        self._idle.extend(conns)

    def acquire_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    def release(self, conn: Connection) -> None:
        if not conn.closed:
            self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)

    def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()


async def request_once(
    url: str, method: str = "GET", path: str = "", body: bytes = b"", timeout_s: float = 10.0
) -> tuple[int, bytes]:
    """One request outside the timed path (metadata checks, metrics scrapes)."""
    target = Target.parse(url)
    pool = ConnectionPool(target)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()

    def done(status: int, headers: dict[str, str], data: bytes, t: int, ctx: Any) -> None:
        if not fut.done():
            fut.set_result((status, data))

    try:
        conn = await asyncio.wait_for(pool.open(), timeout_s)
        conn.send(build_request(target, method, path, body), None, done)
        return await asyncio.wait_for(fut, timeout_s)
    finally:
        pool.close()

"""Token streams over HTTP/1.1: an incremental Server-Sent Events parser and a streaming connection.

A generative server answers one request with a stream of events (SSE ``data:`` lines, one token or a few
per event), so the load generator needs every event's arrival time, not only the last byte's.
:class:`StreamConnection` is the generator's keep-alive :class:`~latencylab.load.http.Connection` taught to
read such a response as it arrives: it unframes the body (chunked, ``Content-Length``, or until the server
closes), splits it into SSE events (:class:`SseParser`) and hands each to the protocol's decoder (a
:class:`StreamKind`, e.g. OpenAI's or OIP's in ``latencylab.load.gen_client``) with the time of the read
that completed it (one ``perf_counter_ns`` per ``data_received``, as every streaming benchmark does). What
the decoder learnt lands in a :class:`Trace`, one per request, given to the generator before the usual
completion callback.

Every way a stream can go wrong ends the request with one clear reason in ``Trace.error`` (the generator
counts it as an error): a non-2xx status (with the server's message), a 2xx answer that is not an event
stream, an error event, malformed event data, a stream that ends before its protocol's end marker or
without a single token, and a connection lost mid-stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from latencylab.load.http import Connection, ConnectionPool

MAX_REASON = 160  # characters of a server's message kept in a reason (errors_by_reason stays readable)


@dataclass(slots=True)
class Trace:
    """What one streamed request delivered: token-carrying events with their arrival times (ns).

    ``chunk_ns``: arrival time of each event that carried output text; ``chunk_tokens``: tokens in it (1
    unless the protocol says); ``usage_tokens``: the server's own count of output tokens (OpenAI
    ``usage.completion_tokens``), when it sent one; ``streamed``: False for a one-shot JSON answer (one
    "chunk" at the end: no TTFT, TPOT or ITL of its own); ``error``: why the request failed ("" if it did not).
    """

    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_tokens: int | None = None
    saw_end: bool = False  # the protocol's end marker (OpenAI "[DONE]") arrived
    streamed: bool = True
    error: str = ""

    def token(self, t_ns: int, n: int = 1) -> None:
        self.chunk_ns.append(t_ns)
        self.chunk_tokens.append(n)

    def fail(self, reason: str) -> None:
        if not self.error:  # the first reason is the cause; what follows is usually its consequence
            self.error = reason[:MAX_REASON]

    @property
    def output_tokens(self) -> int:
        """The server's count when it gave one, else the tokens counted in the stream."""
        return self.usage_tokens if self.usage_tokens is not None else sum(self.chunk_tokens)

    def shifted(self, origin_ns: int) -> Trace:
        """A copy with times relative to ``origin_ns`` (the run start)."""
        return Trace(
            [t - origin_ns for t in self.chunk_ns], list(self.chunk_tokens), self.usage_tokens, self.saw_end,
            self.streamed, self.error,
        )  # fmt: skip


class StreamKind(Protocol):
    """One generative protocol's reading of a response (``latencylab.load.gen_client`` has the real ones)."""

    @property
    def name(self) -> str: ...

    @property
    def needs_end(self) -> bool:
        """The stream must end with an end marker ("[DONE]"); else the end of the body ends it."""

    @property
    def streaming(self) -> bool:
        """A 2xx answer must be an event stream (False: one JSON document, as OIP ``generate``)."""

    def event(self, trace: Trace, kind: str, data: str, t_ns: int) -> None:
        """Record one SSE event (``kind``: its ``event:`` field, "" by default) that arrived at ``t_ns``."""

    def whole(self, trace: Trace, body: bytes, t_ns: int) -> None:
        """Record a complete non-streamed 2xx body (only when ``streaming`` is False)."""


def error_message(body: bytes) -> str:
    """The human part of an error body: OpenAI's ``{"error": {"message": ...}}``, OIP's ``{"error": ...}``,
    FastAPI's ``{"detail": ...}``, or the text itself."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:MAX_REASON]
    if isinstance(obj, str):
        return obj[:MAX_REASON]
    if isinstance(obj, dict):
        for key in ("error", "detail", "message"):
            val = obj.get(key)
            if isinstance(val, dict):
                val = val.get("message", val)
            if val:
                return str(val)[:MAX_REASON]
    return text[:MAX_REASON]


class SseParser:
    """Incremental Server-Sent Events parser (the WHATWG event-stream format, minus ``id``/``retry``).

    ``feed(bytes)`` returns the events completed by those bytes as ``(event type, data)`` pairs: data lines
    joined with newlines, the one space after ``data:`` dropped, comments (``:`` lines, e.g. keep-alive pings)
    skipped. Lines end in LF or CRLF; a line or event split across reads is completed by the next feed.
    """

    __slots__ = ("_buf", "_data", "_kind")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._kind = ""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        self._buf += data
        out: list[tuple[str, str]] = []
        start = 0
        buf = self._buf
        while True:
            eol = buf.find(b"\n", start)
            if eol < 0:
                break
            line = bytes(buf[start:eol]).rstrip(b"\r").decode("utf-8", "replace")
            start = eol + 1
            if not line:
                if self._data:
                    out.append((self._kind, "\n".join(self._data)))
                self._data = []
                self._kind = ""
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._kind = value
        del buf[:start]
        return out

    @property
    def pending(self) -> bool:
        """An event was begun but not ended by a blank line."""
        return bool(self._data) or bool(self._buf.strip())


class ChunkedDecoder:
    """Incremental decoder of an HTTP/1.1 chunked body: ``feed(bytes)`` returns the payload bytes so far
    decoded; ``done`` once the last chunk and its trailer are read. Raises ValueError on a bad chunk size."""

    __slots__ = ("_buf", "_left", "_state", "done")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._left = 0  # payload bytes left in the current chunk
        self._state = "size"  # size -> data -> crlf -> size ... -> trailer
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        out = bytearray()
        while not self.done:
            if self._state == "size":
                eol = buf.find(b"\r\n")
                if eol < 0:
                    break
                size_text = bytes(buf[:eol]).split(b";")[0].strip()
                self._left = int(size_text, 16)  # ValueError: not a chunk size
                del buf[: eol + 2]
                self._state = "data" if self._left else "trailer"
            elif self._state == "data":
                take = min(self._left, len(buf))
                if not take:
                    break
                out += buf[:take]
                del buf[:take]
                self._left -= take
                if not self._left:
                    self._state = "crlf"
            elif self._state == "crlf":
                if len(buf) < 2:
                    break
                del buf[:2]
                self._state = "size"
            else:  # trailer: header lines until an empty one
                eol = buf.find(b"\r\n")
                if eol < 0:
                    break
                line = bytes(buf[:eol])
                del buf[: eol + 2]
                if not line:
                    self.done = True
        return bytes(out)


TraceSink = Callable[[Any, Trace], None]


class StreamConnection(Connection):
    """A keep-alive connection that reads each response as a token stream (see the module docstring).

    The completion callback gets the HTTP status, headers, an empty body (or the failure reason with status
    0, as the base class does) and the time of the last byte; the request's :class:`Trace` goes to ``sink``
    just before it.
    """

    __slots__ = ("_chunked", "_ctype", "_framing", "_headers", "_kind", "_left", "_raw", "_sink", "_sse",
                 "_status", "_trace")  # fmt: skip

    def __init__(self, pool: ConnectionPool, kind: StreamKind, sink: TraceSink) -> None:
        super().__init__(pool)
        self._kind = kind
        self._sink = sink
        self._reset()

    def _reset(self) -> None:
        self._status = -1  # -1: head not read yet
        self._headers: dict[str, str] = {}
        self._framing = ""  # "length" | "chunked" | "close"
        self._left = 0
        self._chunked: ChunkedDecoder | None = None
        self._sse: SseParser | None = None  # set for a 2xx event stream
        self._raw = bytearray()  # the body of anything that is not read as a stream
        self._ctype = ""
        self._trace = Trace()

    def send(self, request: bytes, ctx: Any, on_done: Any) -> None:
        self._reset()
        self._buf.clear()
        super().send(request, ctx, on_done)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if self._on_done is None:  # nothing in flight (bytes after a finished answer): not ours to read
            return
        buf = self._buf
        buf += data
        if self._status < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            if not self._read_head(bytes(buf[:head_end])):
                return
            body = bytes(buf[head_end + 4 :])
        else:
            body = bytes(buf)
        buf.clear()
        try:
            payload, complete = self._unframe(body)
        except ValueError:
            self._trace.fail("malformed chunked body")
            self._finish(now, close=True)
            return
        if self._sse is not None:
            for kind, text in self._sse.feed(payload):
                self._kind.event(self._trace, kind, text, now)
        else:
            self._raw += payload
        if complete:
            self._finish(now)

    def _read_head(self, head_bytes: bytes) -> bool:
        head = head_bytes.decode("latin-1").split("\r\n")
        try:
            self._status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail("malformed HTTP status line")
            return False
        for line in head[1:]:
            k, _, v = line.partition(":")
            self._headers[k.strip().lower()] = v.strip()
        h = self._headers
        if h.get("transfer-encoding", "").lower() == "chunked":
            self._framing, self._chunked = "chunked", ChunkedDecoder()
        elif "content-length" in h:
            self._framing, self._left = "length", int(h["content-length"])
        else:
            self._framing = "close"  # the body ends when the server closes the connection
        self._ctype = h.get("content-type", "").split(";")[0].strip().lower()
        if 200 <= self._status < 300 and self._kind.streaming and self._ctype == "text/event-stream":
            self._sse = SseParser()
        return True

    def _unframe(self, body: bytes) -> tuple[bytes, bool]:
        if self._framing == "chunked":
            assert self._chunked is not None
            return self._chunked.feed(body), self._chunked.done
        if self._framing == "length":
            take = body[: self._left]
            self._left -= len(take)
            return take, self._left == 0
        return body, False

    def _finish(self, now: int, close: bool = False) -> None:
        trace, status = self._trace, self._status
        if 200 <= status < 300:
            if self._sse is not None:
                if not trace.error:
                    if self._sse.pending:
                        trace.fail("stream ended inside an event (no blank line after its data)")
                    elif self._kind.needs_end and not trace.saw_end:
                        trace.fail(f"stream ended without [DONE] after {len(trace.chunk_ns)} token chunk(s)")
                    elif not trace.chunk_ns:
                        trace.fail("stream ended without a token")
            elif self._kind.streaming:
                # the body is an answer, not a message: leave it out, so that the reason counts as one kind
                trace.fail(f"answered {self._ctype or 'no Content-Type'} to a streaming request, not an SSE stream")
            else:
                self._kind.whole(trace, bytes(self._raw), now)
        elif status not in (429, 503):
            trace.fail(f"HTTP {status}: {error_message(bytes(self._raw))}")
        cb, ctx = self._on_done, self._ctx
        self._on_done = None
        self._ctx = None
        self.busy = False
        keep = not close and self._framing != "close" and self._headers.get("connection", "").lower() != "close"
        if keep:
            self._pool.release(self)
        elif self.transport is not None:
            self.closed = True
            self.transport.close()
        self._sink(ctx, trace)
        if cb is not None:
            cb(status, self._headers, b"", now, ctx)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._on_done is not None and self._status >= 0:
            if self._framing == "close":  # the close is the end of the body
                self.closed = True
                self._pool.forget(self)
                self._finish(time.perf_counter_ns(), close=True)
                return
            n = len(self._trace.chunk_ns)
            # "and [DONE]": the server ended the stream and then cut the body (llama-cpp-python does when a new
            # request interrupts the one in progress): the answer was cut short, so it is still an error
            done = " and [DONE]" if self._trace.saw_end else ""
            self._trace.fail(
                f"stream closed early after {n} token chunk(s){done}: {exc or 'connection closed by server'}"
            )
        super().connection_lost(exc)  # -> _fail: the trace goes to the sink, the request ends as an error

    def _fail(self, reason: str) -> None:
        if self._on_done is not None:
            self._trace.fail(reason)
            self._sink(self._ctx, self._trace)
        super()._fail(reason)

"""What one client may cost the server before it is answered: head size, head and body read times, idle time.

uvicorn's httptools protocol, which the server runs, has no limit on a request head's size (llhttp keeps none)
and no timer from a connection's opening to its first request's head: a client sending an 8 MB header is
served, and one that sends half a request line and stalls holds its connection (and its socket, its parser)
forever. :func:`guarded_protocol` returns a subclass that closes both holes and answers, like every other error
of this server, in JSON:

* a head (request line and headers) over ``max_head_bytes`` is answered 431 and the connection closed: counted
  exactly at each header, and while a head arrives in pieces, at every piece, so no more than one socket read
  beyond the limit is ever buffered;
* a head that has not arrived ``head_timeout_s`` after the connection opened or the previous response was sent
  is answered 408 (or, if not one byte of it came, the connection is just closed);
* the parser's own refusals (a malformed request) are a JSON 400 instead of uvicorn's plain text;
* each request's scope carries a :class:`DisconnectHook` (``scope["extensions"][DISCONNECT]``) that the
  connection fires when it is lost before the request's response is complete, so the app can cancel the work of
  a client that has gone (app.py) without a task per request listening on ``receive``;
* with a ``refuser`` (serve/head_refusal.py), an inference request that admission would shed is answered 503
  + Retry-After by the connection itself, from its head, once its body is in: no ASGI task is created for it.

The body's time limit, ``body_timeout_s``, is the app's (``app._read_body``): the head is in by then, so the
answer is a normal response (408). ``keep_alive_s`` is uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from latencylab.serve.protocol_response import error_body

if TYPE_CHECKING:
    from latencylab.serve.head_refusal import HeadRefusal, HeadRefuser

__all__ = ["DISCONNECT", "DisconnectHook", "HttpLimits", "guarded_protocol"]

DISCONNECT = "latencylab.disconnect"  # the scope extension holding a request's DisconnectHook


class DisconnectHook:
    """Fired by the connection when it is lost before its request's response is complete: ``gone`` turns true
    and every callback added (and not removed) is called once, on the event loop."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._callbacks: list[Callable[[], object]] = []

    def add(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` at the disconnect (at once if the client has already gone)."""
        if self.gone:
            callback()
        else:
            self._callbacks.append(callback)

    def remove(self, callback: Callable[[], object]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        if self.gone:
            return
        self.gone = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Per-connection limits of the HTTP server (docs/serve.md, "Limits")."""

    max_head_bytes: int = 32 * 1024  # request line + headers; beyond: 431, connection closed (h11's default is 16 KiB)
    head_timeout_s: float = 10.0  # from connection open / previous response to the end of the next head: 408
    body_timeout_s: float = 30.0  # from the handler's start to the last byte of the body: 408
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing; httptools wraps it and uvicorn calls send_400_response."""


class _Held:
    """A request refused from its head whose body is still arriving (it is kept: the body may decide)."""

    __slots__ = ("chunks", "keep_alive", "refusal")

    def __init__(self, refusal: HeadRefusal, keep_alive: bool) -> None:
        self.refusal = refusal
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []


def guarded_protocol(limits: HttpLimits, refuser: HeadRefuser | None = None) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits`` on request heads (pass it as ``uvicorn.Config(http=...)``),
    and with a ``refuser``, admission's refusals answered from the head (serve/head_refusal.py).

    It overrides uvicorn's per-connection callbacks, which are not a public API: the test of these limits
    (tests/test_serve_hardening.py) runs against a real server, so an incompatible uvicorn fails it."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False  # a request's first byte was parsed, its head's end not yet
            self._head_exact = 0  # bytes of the URL and complete headers of the head in progress
            self._head_streamed = 0  # bytes received in reads that began and ended inside the head in progress
            self._head_timer: asyncio.TimerHandle | None = None
            self._refusal: tuple[int, str] | None = None
            self._hooks: deque[DisconnectHook] = deque()  # requests begun and not yet answered, in order
            self._held: _Held | None = None  # a request refused from its head, its body still arriving

        # -- connection and parser callbacks

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)
            hooks, self._hooks = self._hooks, deque()
            for hook in hooks:  # their clients are gone: whatever still works for them can stop
                hook.fire()

        def data_received(self, data: bytes) -> None:
            was_in_head = self._in_head
            super().data_received(data)
            if was_in_head and self._in_head and not self.transport.is_closing():
                self._head_streamed += len(data)
                if self._head_streamed > limits.max_head_bytes:
                    self._refuse(431, self._too_large())

        def on_message_begin(self) -> None:
            # a request pipelined behind one refused here: the keep-alive timer armed by that refusal's
            # completion (in this same read) must not close the connection under it
            self._unset_keepalive_if_required()
            super().on_message_begin()
            hook = DisconnectHook()
            self._hooks.append(hook)
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[DISCONNECT] = hook
            self._in_head = True
            self._head_exact = self._head_streamed = 0
            if self._head_timer is None:
                self._arm_head_timer()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._cancel_head_timer()
            if refuser is not None and (self.cycle is None or self.cycle.response_complete) and not self.pipeline:
                refusal = refuser.decide(self.parser.get_method(), self.url, self.headers)
                if refusal is not None:
                    self._held = _Held(refusal, self.parser.should_keep_alive())
                    self._head_timer = self.loop.call_later(limits.body_timeout_s, self._body_timed_out)
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._held is not None:
                self._held.chunks.append(body)  # bounded: the refuser requires Content-Length <= the body limit
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            held, self._held = self._held, None
            if held is None:
                super().on_message_complete()
                return
            self._cancel_head_timer()
            body = b"".join(held.chunks)
            assert refuser is not None
            if refuser.body_decides(held.refusal, body):  # the body may state a longer deadline: the app decides
                super().on_headers_complete()
                if body:
                    super().on_body(body)
                super().on_message_complete()
                return
            self._send_refusal(held)

        def _send_refusal(self, held: _Held) -> None:
            r = held.refusal
            head = [STATUS_LINE[503]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"retry-after: ",
                r.retry_after,
                b"\r\ncontent-length: %d\r\n" % len(r.body),
                b"\r\n" if held.keep_alive else b"connection: close\r\n\r\n",
                r.body,
            ]
            assert refuser is not None
            refuser.sent(r)  # counted first: a client that reads the answer then finds it counted
            self.transport.write(b"".join(head))
            if not held.keep_alive:
                self.transport.close()
            self.on_response_complete()

        def _body_timed_out(self) -> None:
            self._head_timer = None
            if self._held is not None and not self.transport.is_closing():
                self._held = None
                self._refuse(408, f"request body not received within {limits.body_timeout_s:g} s")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._hooks:  # responses complete in the order their requests began (HTTP/1.1 pipelining)
                self._hooks.popleft()
            # Waiting for the next head (no pipelined request was started, none is half-parsed): time it.
            idle = self.cycle is None or self.cycle.response_complete
            if idle and self._head_timer is None and not self.transport.is_closing():
                self._arm_head_timer()

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this on any parser error, including the one _count raises to stop a long head.
            status, message = self._refusal or (400, f"malformed HTTP request: {msg}")
            self._refuse(status, message)

        # -- helpers

        def _count(self, n: int) -> None:
            self._head_exact += n
            if self._head_exact > limits.max_head_bytes:
                self._refusal = (431, self._too_large())
                raise _HeadTooLarge

        def _too_large(self) -> str:
            return f"request line and headers exceed the limit of {limits.max_head_bytes} bytes"

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(limits.head_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False  # a request is being answered: close once it is
            elif self._in_head:
                self._refuse(408, f"request head not received within {limits.head_timeout_s:g} s")
            else:
                self.transport.close()  # nothing sent at all: an idle connection

        def _refuse(self, status: int, message: str) -> None:
            """Answer ``status`` with a JSON error and close, unless a response was begun (then just close)."""
            self._cancel_head_timer()
            cycle = self.cycle
            if cycle is None or cycle.response_complete or not cycle.response_started:
                body = error_body(message)
                head = [STATUS_LINE[status]]
                for name, value in self.server_state.default_headers:
                    head += [name, b": ", value, b"\r\n"]
                head += [
                    b"content-type: application/json\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n\r\n",
                    body,
                ]
                self.transport.write(b"".join(head))
            self.transport.close()

    GuardedHttpToolsProtocol.refuser = refuser  # type: ignore[attr-defined]  # its count, for tests and benches
    return GuardedHttpToolsProtocol

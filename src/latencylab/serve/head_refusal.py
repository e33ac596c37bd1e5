"""Refusal in the HTTP protocol: an inference request that admission would shed is answered 503 + Retry-After
from its request line and headers, before an ASGI task, a Starlette ``Request`` or a handler exists.

Under 4x overload on vision the server refuses ~830 requests a second; each refusal used to go the whole way
through uvicorn's request cycle (an asyncio task, Starlette's routing and middleware, the body read through
``receive``, an exception, a ``Response``), so refusing took the event loop that the admitted requests' hand-offs
(preprocess pool -> loop -> compute thread -> loop) wait on (docs/benchmarks/serve.md, session 12: admitted
requests' preprocess wall time doubled while the core was half idle). Here :class:`HeadRefuser` gives the
connection (serve/limits.py's ``guarded_protocol``) admission's verdict at the end of the head
(``serve/early.head_verdict``: the same question as ``early_refusal``, without reserving anything); the
connection then buffers the body (it must be consumed to keep the connection usable, and ``Content-Length`` is
required and bounded here) and, once it is complete, writes the 503 itself, unless the body could state its own
deadline (``early.body_may_state_deadline``), in which case the request goes to the app as if nothing happened.

Anything this layer is not sure of goes to the app unchanged, which answers it as before: a method, path or
model it does not recognise, a wrong or missing bearer token (401 first), a body without ``Content-Length`` or
over the limit (413), a ``Content-Encoding`` (415), a malformed ``X-Request-Start`` (400).
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from latencylab.serve.admission import retry_after_header
from latencylab.serve.batcher import now_reader
from latencylab.serve.early import body_may_state_deadline, head_verdict
from latencylab.serve.protocol_request import BINARY_HEADER
from latencylab.serve.protocol_response import error_body
from latencylab.serve.request_start import request_age_ns
from latencylab.serve.service import Timing
from latencylab.serve.types import ProtocolError

if TYPE_CHECKING:
    from latencylab.serve.app import ServerState

__all__ = ["HeadRefusal", "HeadRefuser"]

_WANTED = (
    b"authorization",
    b"content-length",
    b"content-encoding",
    b"transfer-encoding",
    b"x-request-start",
    b"x-latencylab-deadline-ms",
    BINARY_HEADER.lower().encode(),
)


@dataclass(frozen=True, slots=True)
class HeadRefusal:
    """A refusal decided from a request's head: what to answer once its body is in (unless the body may state
    its own deadline, :meth:`HeadRefuser.body_decides`)."""

    model: str
    reason: str  # admission's shed reason (latencylab_server_shed_total's label)
    body: bytes  # the JSON error body
    retry_after: bytes  # the Retry-After header's value
    json_length: int | None  # the binary extension's JSON part length, if the request has one
    age_s: float | None  # its age at the head (X-Request-Start), when the server trusts the header


class HeadRefuser:
    """Admission's verdict on a request head, for the connection (``guarded_protocol(..., refuser=...)``)."""

    def __init__(self, state: ServerState, deadline_header: str) -> None:
        self.state = state
        self.deadline_header = deadline_header
        self.now_ns = now_reader(state.clock)
        self.refused = 0  # refusals sent from the protocol, since the start

    def decide(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> HeadRefusal | None:
        """The refusal for this head, or None: the app serves the request as usual."""
        if method != b"POST":
            return None
        path = url.split(b"?", 1)[0]
        if b"%" in path:
            return None
        parts = path.split(b"/")
        # b"/v2/models/m/infer" -> ["", "v2", "models", "m", "infer"]; with "versions", "v" before "infer"
        if len(parts) == 5 and parts[4] == b"infer":
            version_b = None
        elif len(parts) == 7 and parts[4] == b"versions" and parts[6] == b"infer":
            version_b = parts[5]
        else:
            return None
        if parts[1] != b"v2" or parts[2] != b"models":
            return None
        state = self.state
        try:
            svc = state.services.get(parts[3].decode("ascii"))
            version = version_b.decode("ascii") if version_b is not None else None
        except UnicodeDecodeError:
            return None
        if svc is None or (version is not None and version not in svc.ladder):
            return None
        h: dict[bytes, bytes] = {}
        for name, value in headers:  # uvicorn lower-cases the names
            if name in _WANTED:
                h[name] = value
        if b"transfer-encoding" in h or h.get(b"content-encoding", b"identity").strip().lower() != b"identity":
            return None
        length = h.get(b"content-length", b"").strip()
        if not (length.isdigit() and len(length) <= 18 and int(length) <= state.cfg.max_body_bytes):
            return None
        if state.token is not None:
            expected = f"Bearer {state.token}".encode()
            if not hmac.compare_digest(h.get(b"authorization", b""), expected):
                return None
        start = self.now_ns()
        timing = Timing(start)
        stamp = h.get(b"x-request-start") if state.cfg.trust_request_start else None
        try:
            if stamp is not None:
                timing.age_ns = request_age_ns(stamp.decode("latin-1"), time.time_ns())
            deadline = h.get(self.deadline_header.encode())
            deadline_text = deadline.decode("latin-1") if deadline is not None else None
        except ProtocolError:
            return None
        pinned = svc.ladder.index(version) if version is not None and version != "cache" else None
        verdict = head_verdict(svc, timing, start, pinned, deadline_text, self.deadline_header)
        if verdict is None:
            return None
        reason, error = verdict
        json_length = h.get(BINARY_HEADER.lower().encode(), b"").strip()
        return HeadRefusal(
            svc.name,
            reason,
            error_body(str(error)),
            retry_after_header(error.retry_after_s or 1.0).encode(),
            int(json_length) if json_length.isdigit() and len(json_length) <= 18 else None,
            timing.age_ns / 1e9 if stamp is not None else None,
        )

    @staticmethod
    def body_decides(refusal: HeadRefusal, body: bytes) -> bool:
        """Whether the body could state its own deadline (then the app decodes it and decides)."""
        headers = {BINARY_HEADER.lower(): str(refusal.json_length)} if refusal.json_length is not None else {}
        return body_may_state_deadline(body, headers)

    def sent(self, refusal: HeadRefusal) -> None:
        """The refusal was written: count it as the app counts a 503 (shed by reason, requests by code)."""
        self.refused += 1
        metrics = self.state.metrics
        metrics.shed.labels(refusal.model, refusal.reason).inc()
        metrics.requests.labels(refusal.model, "-", "503").inc()
        if refusal.age_s is not None:  # as the handler records every stamped request's age
            metrics.request_age.labels(refusal.model).observe(refusal.age_s)

"""Refusal before decoding: a request the server would shed is answered 503 from its headers alone.

Under overload most requests are refused (at 4x capacity, ~85% of them), and a refused request used to be
decoded in full first (JSON parse, base64, tensor checks) on the event loop, on the core the compute runs on:
at 4x on vision the server's own mean request time was 13.8 ms while its clients waited 37-38 ms (session 10,
docs/benchmarks/serve.md). Here admission's own question (``Admission.refusal``: would a request admitted now
finish inside its admission target, is the queue full?) is asked before ``decode_infer_request``, with the
deadline the headers give: ``X-Latencylab-Deadline-Ms`` or the model's ``default_deadline_ms``, counted from
``X-Request-Start`` when the server trusts it. A request admitted here still goes through the full admission
after decoding (which reserves its place), so this only ever refuses earlier, never admits more.

The body's own ``parameters.deadline_ms`` wins over the header (serve/protocol_request.py) and may be longer,
so a body that could state one (its JSON holds ``deadline_ms`` or any ``\\u`` escape, which could spell it) is
not judged here: the full path decides it after decoding. The body's bytes are still received (the connection
must consume them to stay usable), but a scan for two byte strings is all the work a refused request costs.
"""

from __future__ import annotations

from collections.abc import Mapping

from latencylab.serve.protocol_request import BINARY_HEADER, deadline_from_header
from latencylab.serve.service import ModelService, ServiceError, Timing
from latencylab.serve.types import ProtocolError

__all__ = ["body_may_state_deadline", "early_refusal", "head_verdict"]

_MARKERS = (b"deadline_ms", b"\\u")


def body_may_state_deadline(body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether the body's JSON could carry a ``deadline_ms`` parameter (then only decoding can tell)."""
    json_part = body
    length = headers.get(BINARY_HEADER.lower(), "").strip()
    if length.isascii() and length.isdigit() and len(length) <= 18:
        json_part = body[: int(length)]  # binary tensor data follows: its bytes may hold anything
    return any(m in json_part for m in _MARKERS)


def early_refusal(
    svc: ModelService,
    timing: Timing,
    now: int,
    pinned: int | None,
    body: bytes,
    headers: Mapping[str, str],
    deadline_header: str,
) -> ServiceError | None:
    """The 503 the request will get, decided before its body is decoded, or None (decode and admit it).

    Mirrors ``ModelService.infer``'s admission (the rung the guard serves now or the pinned one, the learned
    margin's target, the boundary slack, the preprocess lead) without reserving a place or routing a probe;
    a refusal is counted in ``latencylab_server_shed_total`` with admission's own reason."""
    if body_may_state_deadline(body, headers):
        return None
    verdict = head_verdict(svc, timing, now, pinned, headers.get(deadline_header), deadline_header)
    if verdict is None:
        return None
    reason, error = verdict
    svc.metrics.shed.labels(svc.name, reason).inc()
    return error


def head_verdict(
    svc: ModelService, timing: Timing, now: int, pinned: int | None, deadline_text: str | None, deadline_header: str
) -> tuple[str, ServiceError] | None:
    """Admission's refusal of a request from its head alone (the deadline header's value, or None), as
    (reason, the 503), or None; counts nothing (the caller counts what it sends). The body is the caller's to
    check (:func:`body_may_state_deadline`): a deadline stated there wins."""
    try:
        deadline_ms = (
            deadline_from_header(deadline_text, deadline_header)
            if deadline_text is not None
            else svc.cfg.default_deadline_ms
        )
    except ProtocolError:
        return None  # the full path answers it (400, or the body's own deadline)
    start = timing.start - timing.age_ns
    deadline_ns = start + int(float(deadline_ms) * 1e6)
    if now >= deadline_ns:
        late = f"{timing.age_ns / 1e6:.1f} ms old on arrival, " if timing.age_ns else ""
        return "deadline", ServiceError(
            503, f"overloaded (deadline): {late}deadline {float(deadline_ms):g} ms", 1.0, "shed"
        )
    level = svc.guard.level if pinned is None else pinned
    if svc.ladder[level] == "cache" or level >= len(svc.batchers):
        return None  # the cache rung answers without admission
    batcher = svc.batchers[level]
    admit_by, slack, _ = svc.aim(level, start, deadline_ns, now)
    shed = batcher.refusal(admit_by, now, svc.preprocess_lead_ns() + slack)
    if shed is None:
        return None
    return shed.reason, ServiceError(503, f"overloaded ({shed.reason})", shed.retry_after_s, "shed")

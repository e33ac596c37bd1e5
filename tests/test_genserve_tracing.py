"""OTel spans of the generative server (fake engine, in-memory exporter): one ``infer`` span per request, the
caller's trace continued, with queue, prefill, decode and send children in order; a cache hit's one child."""

from __future__ import annotations

import itertools
import json
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from genserve_servers import events, fake_service, post
from latencylab.genserve.server import serve_in_thread
from latencylab.serve.tracing import make_tracer_provider

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


def spans_by_trace(exporter: InMemorySpanExporter) -> list[tuple[Any, list[Any]]]:
    """(root, children in start order) per request."""
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "infer"]
    out = []
    for r in roots:
        kids = [s for s in spans if s.parent is not None and s.parent.span_id == r.context.span_id]
        out.append((r, sorted(kids, key=lambda s: s.start_time)))
    return out


def test_a_request_span_with_prefill_and_decode_children() -> None:
    exporter = InMemorySpanExporter()
    with serve_in_thread(fake_service(reply=9), tracer_provider=make_tracer_provider(exporter=exporter)) as url:
        status, _, _ = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 6},
                            {"traceparent": f"00-{TRACE}-{PARENT}-01"})  # fmt: skip
        assert status == 200
        status, _, body = post(url, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}], "stream": True})  # fmt: skip
        assert status == 200 and events(body)[-1] == "[DONE]"
    (root, kids), (sroot, skids) = spans_by_trace(exporter)
    assert format(root.context.trace_id, "032x") == TRACE  # continued the caller's trace
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT
    assert [k.name for k in kids] == ["queue", "prefill", "decode", "send"]
    for a, b in itertools.pairwise(kids):  # back to back, inside the request's span
        assert a.end_time == b.start_time
    assert root.start_time == kids[0].start_time and kids[-1].end_time <= root.end_time
    attrs = dict(root.attributes)
    assert attrs["latencylab.completion_tokens"] == 6 and attrs["latencylab.finish_reason"] == "length"
    assert attrs["latencylab.rung"] == "fp32" and attrs["latencylab.ttft_ms"] > 0 and attrs["latencylab.tpot_ms"] > 0
    ttft_ns = kids[1].end_time - root.start_time  # queue + prefill = the time to the first token
    assert abs(ttft_ns / 1e6 - attrs["latencylab.ttft_ms"]) < 1e-3
    # the streamed request: its own trace, the same children; 8 tokens then EOS
    assert sroot.context.trace_id != root.context.trace_id and sroot.parent is None
    assert [k.name for k in skids] == ["queue", "prefill", "decode", "send"]
    assert dict(sroot.attributes)["latencylab.completion_tokens"] == 8


def test_a_cached_answer_has_one_cache_child_and_says_so() -> None:
    exporter = InMemorySpanExporter()
    svc = fake_service(ladder=("fp32", "cache"), guard={"dwell_s": 0.0, "min_samples": 1})
    with serve_in_thread(svc, tracer_provider=make_tracer_provider(exporter=exporter)) as url:
        first = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 3})
        assert svc.guard is not None
        svc.guard.slo.observe(0, 1e12)  # a breach at fp32 (1000 s): the next decision goes to the cache rung
        svc.evaluate_guard()  # (or the step thread's timer did, first)
        assert svc.guard.level == 1
        status, headers, body = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 3})
    assert status == 200 and headers["x-latencylab-rung"] == "cache" and headers["x-latencylab-cache"] == "hit"
    obj = json.loads(body)
    assert obj["choices"][0]["text"] == json.loads(first[2])["choices"][0]["text"] == "abc"
    assert obj["latencylab"] == {"rung": "cache", "producer": "fp32", "cached": True, "max_tokens_cap": None,
                                 "capped": False}  # fmt: skip
    (_, kids1), (root, kids) = spans_by_trace(exporter)
    assert [k.name for k in kids1] == ["queue", "prefill", "decode", "send"]
    assert [k.name for k in kids] == ["cache"] and dict(root.attributes)["latencylab.cached"] is True

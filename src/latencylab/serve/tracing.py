"""OpenTelemetry spans per request stage, with W3C trace-context propagation.

Each infer request becomes an ``infer`` span (child of the caller's
``traceparent`` if it sent one) with children receive, queue, batch,
preprocess, compute, postprocess and send. Stage boundaries are measured
while serving; spans are emitted afterwards with those exact timestamps
(epoch ns), so tracing adds no work on the batching path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

SPAN_STAGES = ("receive", "queue", "batch", "preprocess", "compute", "postprocess", "send")


def make_tracer_provider(
    otlp_endpoint: str | None = None, exporter: SpanExporter | None = None, service_name: str = "latencylab-serve"
) -> TracerProvider | None:
    """A provider exporting to ``exporter`` (tests: InMemorySpanExporter) or OTLP/HTTP; None = tracing off."""
    if exporter is None and otlp_endpoint is None:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    return provider


class RequestTracer:
    def __init__(self, provider: TracerProvider | None) -> None:
        self._tracer = provider.get_tracer("latencylab.serve") if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def emit(
        self,
        headers: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        stages: Sequence[tuple[str, int, int]],
        attributes: Mapping[str, Any],
    ) -> None:
        """One ``infer`` span from start_ns to end_ns with a child per (stage, start_ns, end_ns) (epoch ns)."""
        if self._tracer is None:
            return
        ctx = propagate.extract(dict(headers))
        root = self._tracer.start_span("infer", context=ctx, start_time=start_ns, attributes=dict(attributes))
        parent = trace.set_span_in_context(root)
        for name, s, e in stages:
            child = self._tracer.start_span(name, context=parent, start_time=s)
            child.end(end_time=max(e, s))
        root.end(end_time=end_ns)

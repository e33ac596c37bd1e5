"""Prometheus metrics of the server (one registry per server, so tests can run several).

Histogram buckets are dense around the SLO (every 5% from 50% to 150% of it) so that
``histogram_quantile`` estimates P99 near the objective to within a few percent.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

STAGES = ("queue", "batch", "preprocess", "compute", "postprocess", "request")


def slo_buckets(slo_s: float) -> tuple[float, ...]:
    """Geometric buckets 0.25 ms .. 10 s, plus 5%-steps from 0.5 to 1.5 x the SLO."""
    geometric = [0.00025 * 2 ** (i / 2) for i in range(32) if 0.00025 * 2 ** (i / 2) <= 10.0]
    dense = [slo_s * (0.5 + 0.05 * i) for i in range(21)]
    return tuple(sorted({round(b, 6) for b in geometric + dense}))


class ServerMetrics:
    def __init__(self, slo_s_by_model: dict[str, float]) -> None:
        self.registry = CollectorRegistry()
        slo = min(slo_s_by_model.values()) if slo_s_by_model else 0.1
        r = self.registry
        self.stage = Histogram(
            "latencylab_server_stage_seconds",
            "Server-side time per stage (request = end to end inside the server).",
            ["model", "stage"],
            buckets=slo_buckets(slo),
            registry=r,
        )
        self.batch_size = Histogram(
            "latencylab_server_batch_size",
            "Requests per executed batch.",
            ["model", "variant"],
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
            registry=r,
        )
        self.queue_depth = Gauge(
            "latencylab_server_queue_depth", "Requests waiting for a batch.", ["model"], registry=r
        )
        self.in_flight = Gauge(
            "latencylab_server_in_flight", "Requests admitted and not yet answered.", ["model"], registry=r
        )
        self.ladder_level = Gauge(
            "latencylab_server_ladder_level", "Current fallback ladder level (0 = primary).", ["model"], registry=r
        )
        self.alarm = Gauge(
            "latencylab_server_alarm", "1 while the model is answering from the cache.", ["model"], registry=r
        )
        self.batches = Counter(
            "latencylab_server_batches",
            "Executed batches by release reason.",
            ["model", "variant", "reason"],
            registry=r,
        )
        self.shed = Counter(
            "latencylab_server_shed", "Requests refused (503/429) by reason.", ["model", "reason"], registry=r
        )
        self.errors = Counter(
            "latencylab_server_errors", "Requests answered with an error, by kind.", ["model", "kind"], registry=r
        )
        self.gc_pause = Histogram(
            "latencylab_server_gc_pause_seconds",
            "How long each garbage collection held the server process (every thread stops), by generation.",
            ["generation"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=r,
        )
        self.gc_frozen = Gauge(
            "latencylab_server_gc_frozen_objects",
            "Objects frozen (gc.freeze) once the server was warm: full collections skip them.",
            registry=r,
        )
        self.misses = Counter(
            "latencylab_server_deadline_misses",
            "Admitted requests answered 504, by where each was when its deadline was missed: preprocess, queued, "
            "computing (at the deadline), release_passed, release_late (failed at its batch's release: the deadline "
            "had passed / the batch could not finish by it), queue_passed, queue_late (the same, found while queued).",
            ["model", "variant", "where"],
            registry=r,
        )
        self.requests = Counter(
            "latencylab_server_requests",
            "Answered requests by producer and status code.",
            ["model", "producer", "code"],
            registry=r,
        )
        self.switch = Histogram(
            "latencylab_server_ladder_switch_seconds",
            "Time from a ladder decision to the first response at the new level.",
            ["model", "to"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.probes = Counter(
            "latencylab_server_probes",
            "Shadow probes sent to a rung above the current one.",
            ["model", "to"],
            registry=r,
        )
        self.cache = Counter(
            "latencylab_server_cache", "Result cache lookups by outcome.", ["model", "outcome"], registry=r
        )
        self.slack = Gauge(
            "latencylab_server_admission_slack_seconds",
            "Time admission adds to its predicted finish: the recent error quantile beyond the fixed margin.",
            ["model", "variant"],
            registry=r,
        )
        self.idle_slack = Gauge(
            "latencylab_server_admission_idle_slack_seconds",
            "The admission slack of requests with nothing ahead of them (admit_when_idle): learned from their "
            "own errors alone.",
            ["model", "variant"],
            registry=r,
        )
        self.margin = Gauge(
            "latencylab_server_admission_margin_seconds",
            "The planning margin admission learned from admitted latency: it plans each finish by the deadline "
            "less this (for a budget of one SLO).",
            ["model", "variant"],
            registry=r,
        )
        self.slo_target = Gauge(
            "latencylab_server_slo_target_fraction",
            "Admission plans each finish by its deadline less (1 - this) x min(its deadline budget, the SLO).",
            ["model"],
            registry=r,
        )
        self.request_age = Histogram(
            "latencylab_server_request_age_at_handler_seconds",
            "Time from a request's X-Request-Start stamp to its handler start (requests with the header).",
            ["model"],
            buckets=slo_buckets(slo),
            registry=r,
        )

    def observe_stages(self, model: str, stages: Sequence[tuple[str, float]]) -> None:
        for name, seconds in stages:
            self.stage.labels(model, name).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

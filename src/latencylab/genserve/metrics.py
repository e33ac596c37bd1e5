"""Prometheus metrics of the generative server (one registry per server; docs/metrics.md, "Generative serving").

Server-side token times are on the scheduler's clock: TTFT from the handler's start to the end of the step
that chose the first token; ITL between the steps that chose consecutive tokens; TPOT = (last - first) /
(tokens - 1) per request; queue = handler start to joining the running batch. Shadow probes of the SLO guard
(a sequence whose ``user`` has ``shadow = True``) are left out of the request histograms and token counts:
they are the guard's evidence, not traffic. The ladder's own series: the rung (``ladder_level``), the alarm,
transitions, probes, answer-cache lookups, requests per rung, the switch time.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from latencylab.genserve.scheduler import Seq, StepReport

_TIME = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
         10.0, 20.0)  # fmt: skip


class GenMetrics:
    def __init__(self, model: str, kv_budget_tokens: int) -> None:
        self.model = model
        self.kv_budget = kv_budget_tokens
        self.registry = r = CollectorRegistry()
        labels = ["model"]

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_TIME, registry=r)

        self.ttft = hist("latencylab_gen_ttft_seconds", "Handler start to the first output token chosen.")
        self.tpot = hist("latencylab_gen_tpot_seconds", "(last token - first token) / (tokens - 1) per request.")
        self.itl = hist("latencylab_gen_itl_seconds", "Time between consecutive tokens of a request.")
        self.queue = hist("latencylab_gen_queue_seconds", "Handler start to joining the running batch.")
        self.prefill_step = hist("latencylab_gen_prefill_step_seconds", "Prefill part of a step (its chunks).")
        self.decode_step = hist("latencylab_gen_decode_step_seconds", "Decode forward of a step (whole batch).")
        self.batch = Histogram(
            "latencylab_gen_decode_batch_size", "Sequences per decode step.", labels,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), registry=r,
        )  # fmt: skip
        self.running = Gauge("latencylab_gen_running_seqs", "Sequences in the running batch.", labels, registry=r)
        self.waiting = Gauge("latencylab_gen_waiting_seqs", "Sequences queued for a slot.", labels, registry=r)
        self.kv_usage = Gauge(
            "latencylab_gen_kv_usage_ratio", "KV positions reserved by running sequences / the KV budget.", labels,
            registry=r,
        )  # fmt: skip
        self.kv_used = Gauge("latencylab_gen_kv_used_tokens", "KV positions holding real tokens.", labels, registry=r)
        self.tokens = Counter(
            "latencylab_gen_tokens", "Tokens processed, by kind (prompt_cached: prompt tokens the prefix cache held).",
            ["model", "kind"], registry=r,
        )  # fmt: skip
        self.prefix = Counter(
            "latencylab_gen_prefix_cache_requests", "Requests whose prompt began with the cached prefix (hit) or not.",
            ["model", "result"], registry=r,
        )  # fmt: skip
        self.tokens_per_s = Gauge(
            "latencylab_gen_output_tokens_per_second",
            "Output tokens per second over the last 10 s.",
            labels,
            registry=r,
        )
        self.requests = Counter(
            "latencylab_gen_requests", "Answered requests by status code and finish reason.",
            ["model", "code", "finish"], registry=r,
        )  # fmt: skip
        self.shed = Counter("latencylab_gen_shed", "Requests refused (503) by reason.", ["model", "reason"], registry=r)
        self.forecast_scale = Gauge(
            "latencylab_gen_admission_forecast_scale",
            "What admission multiplies its TTFT forecast by: the recent actual / forecast of near-deadline requests.",
            labels, registry=r,
        )  # fmt: skip
        self.forecast_ratio = Histogram(
            "latencylab_gen_admission_forecast_ratio",
            "Actual TTFT / admission's unscaled TTFT forecast, per admitted request with a deadline (< 1: the "
            "forecast was pessimistic and may have refused what could have been served).",
            labels, buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0), registry=r,
        )  # fmt: skip
        # the SLO guard's ladder (docs/genserve.md)
        self.ladder_level = Gauge(
            "latencylab_gen_ladder_level", "The guard's rung (0 = the top of the ladder).", labels, registry=r
        )
        self.alarm = Gauge("latencylab_gen_alarm", "1 while the guard serves from its last rung.", labels, registry=r)
        self.transitions = Counter(
            "latencylab_gen_ladder_transitions", "Guard steps by direction.", ["model", "direction"], registry=r
        )
        self.probes = Counter(
            "latencylab_gen_probes", "Shadow probes of the rung above, by rung.", ["model", "rung"], registry=r
        )
        self.cache = Counter(
            "latencylab_gen_cache_lookups", "Answer-cache lookups on the cache rung (hit, stale, miss).",
            ["model", "result"], registry=r,
        )  # fmt: skip
        self.rung_requests = Counter(
            "latencylab_gen_rung_requests", "Requests by the rung that answered them.", ["model", "rung"], registry=r
        )
        self.switch = Histogram(
            "latencylab_gen_ladder_switch_seconds", "Guard decision to the first response at the new rung.",
            ["model", "rung"], buckets=_TIME, registry=r,
        )  # fmt: skip
        # a client that left: how soon its slot was freed, and what was computed for it meanwhile (issue 18)
        self.cancel_free = hist(
            "latencylab_gen_cancel_to_free_seconds",
            "A client's disconnect (the sequence cancelled) to its slot and KV freed at the start of the next step.",
        )
        self.tokens_after_cancel = Histogram(
            "latencylab_gen_tokens_after_cancel", "Tokens chosen for a cancelled sequence after its cancellation.",
            labels, buckets=(0, 1, 2, 3, 5, 10), registry=r,
        )  # fmt: skip
        self._recent: deque[tuple[int, int]] = deque()

    def observe_step(self, rep: StepReport) -> None:
        m = self.model
        if rep.prefill_tokens:
            self.prefill_step.labels(m).observe(rep.prefill_ns / 1e9)
            self.tokens.labels(m, "prompt").inc(rep.prefill_tokens)
        if rep.decode_batch:
            self.decode_step.labels(m).observe(rep.decode_ns / 1e9)
            self.batch.labels(m).observe(rep.decode_batch)
        per: dict[int, tuple[Seq, int]] = {}  # a sequence's tokens this step (more than one: speculative decoding)
        for s, _ in rep.tokens:
            if not _shadow(s):
                per[id(s)] = (s, per.get(id(s), (s, 0))[1] + 1)
        for s, c in per.values():  # the gap before each: the first from the last step's token, the rest 0
            for i in range(max(1, len(s.token_ns) - c), len(s.token_ns)):
                self.itl.labels(m).observe((s.token_ns[i] - s.token_ns[i - 1]) / 1e9)
        if n := sum(c for _, c in per.values()):
            self.tokens.labels(m, "completion").inc(n)
        if rep.drafted:
            self.tokens.labels(m, "drafted").inc(rep.drafted)
            self.tokens.labels(m, "draft_accepted").inc(rep.draft_accepted)
        for s in rep.joined:
            if s.joined_ns is not None and not _shadow(s):
                self.queue.labels(m).observe((s.joined_ns - s.arrival_ns) / 1e9)
                self.prefix.labels(m, "hit" if s.cached_tokens else "miss").inc()
                if s.cached_tokens:
                    self.tokens.labels(m, "prompt_cached").inc(s.cached_tokens)
        for s in rep.finished:
            if not _shadow(s):
                self.observe_finish(s)
                if s.finish_reason == "cancelled" and s.cancel_ns is not None and s.finished_ns is not None:
                    self.cancel_free.labels(m).observe(max(0, s.finished_ns - s.cancel_ns) / 1e9)
                    self.tokens_after_cancel.labels(m).observe(sum(1 for t in s.token_ns if t > s.cancel_ns))
        self.set_state(rep.running, rep.waiting, rep.kv_reserved, rep.kv_used)
        # tokens/s over the last 10 s of the scheduler's clock (the end of each step)
        now = rep.end_ns
        self._recent.append((now, n))
        while self._recent and self._recent[0][0] < now - 10_000_000_000:
            self._recent.popleft()
        self.tokens_per_s.labels(m).set(sum(k for _, k in self._recent) / 10.0)

    def set_state(self, running: int, waiting: int, kv_reserved: int, kv_used: int) -> None:
        """The batch's state after a step (summed over the schedulers when the ladder has more than one)."""
        m = self.model
        self.running.labels(m).set(running)
        self.waiting.labels(m).set(waiting)
        self.kv_usage.labels(m).set(kv_reserved / self.kv_budget)
        self.kv_used.labels(m).set(kv_used)

    def observe_finish(self, s: Seq) -> None:
        m = self.model
        if s.first_token_ns is not None:
            self.ttft.labels(m).observe((s.first_token_ns - s.arrival_ns) / 1e9)
            if s.predicted_s:
                self.forecast_ratio.labels(m).observe((s.first_token_ns - s.arrival_ns) / 1e9 / s.predicted_s)
        if len(s.token_ns) >= 2:
            self.tpot.labels(m).observe((s.token_ns[-1] - s.token_ns[0]) / (len(s.token_ns) - 1) / 1e9)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _shadow(s: Seq) -> bool:
    return bool(getattr(s.user, "shadow", False))

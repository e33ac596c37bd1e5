"""Iteration-level (Orca-style continuous) batching: which sequences run in each model step.

The scheduler knows nothing of HTTP or torch: it drives an :class:`Engine` (``prefill`` a chunk of one
sequence's prompt, ``decode`` one token for each of a batch of sequences, ``release`` a sequence's cache) and
reads the time from an injected :class:`~latencylab.clock.Clock`. One :meth:`Scheduler.step`:

1. applies what happened since the last step: cancelled sequences (a client that left, a stop string seen)
   leave the batch and free their slot and KV reservation now, before any compute is spent on them;
2. admits waiting sequences, first come first served, while fewer than ``max_num_seqs`` run and the KV
   budget holds their reservation (prompt + ``max_tokens`` tokens: reserved whole at admission, so a running
   sequence never needs preemption); the head of the queue is never overtaken (no starvation);
3. prefills: runs at most ``prefill_chunk_tokens`` prompt tokens this step (chunked prefill), oldest sequence
   first; a sequence whose whole prompt is in has its first token;
4. decodes: one forward for every running sequence whose prefill ended in an earlier step, one token each;
5. retires the sequences that finished (EOS, ``max_tokens``).

A long prompt joining therefore costs the others at most one chunk's prefill per step instead of its whole
prefill: their inter-token latency is bounded by ``decode(batch) + prefill(chunk)``.

With ``tpot_slo_s`` set (the server sets its TPOT objective) the prefill budget of a step is tied to it
(genserve/budget.py): the decoding sequences' TPOT slack decides how many prompt tokens the step may take
(between ``min_prefill_tokens`` and ``max_prefill_tokens``; with nothing decoding, ``max_prefill_tokens``: a lone
prompt in one forward), and the batch grows only while the learnt decode step of the larger batch stays
within the planned TPOT (``tpot_target_fraction`` of the objective), so the admitted set cannot imply a
decode step over it. Admission's replay runs the same two rules.

Admission (:meth:`Scheduler.submit`) forecasts the new sequence's TTFT by replaying this policy step by step
on the costs learnt so far (genserve/forecast.py, :class:`~latencylab.genserve.cost.StepCosts`: seeded at
warm-up, then an EWMA of every step): the rest of the step in progress, then every step until its prompt's last
chunk is in, each paying the prefill forwards ahead of it (a chunk budget a step) and a decode forward of the
running batch, whose sequences leave when their expected output (``output_fraction x max_tokens``) is done
and let the waiting ones in. The forecast is scaled by the recent error of forecasts near their deadline
(:class:`~latencylab.genserve.forecast.ForecastError`) and must land, with ``margin_s``, inside
``ttft_target_fraction`` of the time left to the TTFT deadline; a request that does not is refused with
:class:`~latencylab.serve.admission.Shed` (503 + Retry-After: the scaled forecast) before it queues.

Thread model: ``submit``, ``cancel`` and ``stop`` may be called from any thread (the event loop); ``step``
from one worker thread. A lock guards the queues; the engine runs outside it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import deque
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.genserve.cost import StepCosts
from latencylab.genserve.forecast import ForecastError, Pending, expected_output, forecast_ttft_s
from latencylab.genserve.sched_types import (
    Engine,
    GenRequest,
    Sampling,
    SchedulerConfig,
    Seq,
    StepReport,
    TooLarge,
)
from latencylab.serve.admission import Shed
from latencylab.serve.batcher import now_reader

__all__ = [
    "Engine",
    "GenRequest",
    "Sampling",
    "Scheduler",
    "SchedulerConfig",
    "Seq",
    "StepReport",
    "TooLarge",
]


class Scheduler:
    """Continuous batching over an :class:`Engine` (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        cfg: SchedulerConfig | None = None,
        clock: Clock | None = None,
        costs: StepCosts | None = None,
    ) -> None:
        self.engine = engine
        self.cfg = cfg or SchedulerConfig()
        self.clock = clock or PerfCounterClock()
        self.now_ns = now_reader(self.clock)
        self.costs = costs or StepCosts()
        # a fused engine (genserve/packed.py: ``mixed``) runs a step's chunks and decode batch in one forward
        self.fused = bool(getattr(engine, "fused", False))
        self.costs.fused = self.fused
        self.planned = self.cfg.prefill_budget()  # the TPOT plan as configured
        self.budget = self.planned  # ... and as steps use it now: the target over tpot_error's scale
        # actual / planned TPOT of replies near their plan (the TPOT margin; SchedulerConfig.tpot_quantile)
        self.tpot_error = ForecastError(self.cfg.tpot_quantile, max_scale=self.cfg.tpot_max_scale)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._cancelled: list[Seq] = []  # cancelled while waiting: reported by the next step
        self.kv_reserved = 0
        self.forecast_error = ForecastError(self.cfg.forecast_quantile)
        # the last refusals on the deadline, with what decided them (GET /v2/models/{m}/guard: "admission")
        self.recent_sheds: deque[dict[str, Any]] = deque(maxlen=16)
        self._step_eta_ns: int | None = None  # the predicted end of the step in progress
        self.work = threading.Condition(self._lock)  # notified when something is submitted or cancelled
        self.spec_proposed = 0  # speculative decoding (cfg.spec_lookup_k): tokens drafted and kept, all steps
        self.spec_accepted = 0

    # -- the caller's side (any thread) --------------------------------------------------------------------

    def submit(self, req: GenRequest, now: int | None = None, user: Any = None) -> Seq:
        """Queue ``req``, or raise :class:`Shed` (queue full; predicted TTFT past its deadline) or
        :class:`TooLarge` (it could never fit the KV budget)."""
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        if not req.prompt_ids:
            raise ValueError("the prompt has no tokens")
        if req.kv_tokens > self.cfg.kv_budget_tokens:
            raise TooLarge(
                f"prompt ({len(req.prompt_ids)} tokens) + max_tokens ({req.max_tokens}) needs {req.kv_tokens} KV "
                f"positions, more than the server's KV budget of {self.cfg.kv_budget_tokens}"
            )
        hit = self.cached_prefix(req)
        with self._lock:
            now = self.now_ns() if now is None else now
            if len(self.waiting) >= self.cfg.max_waiting:
                raise Shed("queue_full", max(0.1, self._predicted_ttft_s(req, now, 60.0) or 1.0))
            forecast: float | None = None
            predicted: float | None = None
            if req.ttft_deadline_ns is not None:
                left_s = (req.ttft_deadline_ns - now) / 1e9
                allowed_s = self.cfg.ttft_target_fraction * left_s - self.cfg.margin_s
                scale = self.forecast_error.scale(now)
                raw = predicted = self._predicted_ttft_s(req, now, max(0.0, left_s), scale, allowed_s)
                planned = raw * scale
                if planned > allowed_s:  # Retry-After: the whole forecast (the replay above stopped at the deadline)
                    full = self._predicted_ttft_s(req, now, 60.0)
                    self.recent_sheds.append(self._refusal(req, now, full, scale, allowed_s))
                    raise Shed("deadline", max(0.1, full * scale))
                if self.forecast_error.is_near(planned, allowed_s):
                    forecast = raw
            seq = Seq(next(self._ids), req, now, user=user, forecast_s=forecast, predicted_s=predicted)
            seq.prefilled = seq.cached_tokens = hit
            self.waiting.append(seq)
            self.work.notify_all()
        return seq

    def _refusal(self, req: GenRequest, now: int, forecast_s: float, scale: float, allowed_s: float) -> dict[str, Any]:
        """What decided a refusal on the deadline (``recent_sheds``): the forecast, its scale, the allowance, the
        batch and the learnt costs at that moment. Called under the lock."""
        c = self.costs
        return {
            "at_ns": now, "forecast_s": round(forecast_s, 4), "scale": round(scale, 3),
            "allowed_s": round(allowed_s, 4), "prompt_tokens": len(req.prompt_ids), "running": len(self.running),
            "waiting": len(self.waiting), "max_batch": self.max_batch(),
            "prefilling": [s.prompt_len - s.prefilled for s in self.running if s.state == "prefill"],
            "prefill_ms_per_token": round(1e3 * (c.prefill_per_token_s or 0.0), 3),
            "prefill_overhead_ms": round(1e3 * c.prefill_overhead_s, 2),
            "decode_ms": {k: round(v * 1e3, 1) for k, v in sorted(c.decode.by_size.items())},
            "rest_of_step_ms": None if self._step_eta_ns is None else (self._step_eta_ns - now) / 1e6,
        }  # fmt: skip

    def refusals(self) -> list[dict[str, Any]]:
        """The last refusals on the deadline (oldest first), copied under the lock."""
        with self._lock:
            return list(self.recent_sheds)

    def cancel(self, seq: Seq, reason: str = "cancelled") -> None:
        """End ``seq`` at the next step (its client left): its slot and KV reservation are freed then."""
        with self._lock:
            if seq.finished or seq.cancel_reason:
                return
            seq.cancel_reason = reason
            seq.cancel_ns = self.now_ns()
            if seq.state == "waiting" and seq in self.waiting:
                self.waiting.remove(seq)
                self._cancelled.append(seq)
            self.work.notify_all()

    def stop(self, seq: Seq) -> None:
        """End ``seq`` at the next step as a normal finish (the caller saw a stop string)."""
        self.cancel(seq, "stop")

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.waiting or self.running or self._cancelled)

    def wait_for_work(self, timeout_s: float) -> bool:
        """Block (up to ``timeout_s``) until there is something to step; True if there is."""
        with self._lock:
            if not (self.waiting or self.running or self._cancelled):
                self.work.wait(timeout_s)
            return bool(self.waiting or self.running or self._cancelled)

    def cached_prefix(self, req: GenRequest) -> int:
        """Leading prompt tokens of ``req`` the engine's prefix cache holds (0 without one)."""
        ask = getattr(self.engine, "cached_prefix", None)
        return 0 if ask is None else min(int(ask(req.prompt_ids)), len(req.prompt_ids) - 1)

    def predicted_ttft_s(self, req: GenRequest) -> float:
        with self._lock:
            return self._predicted_ttft_s(req)

    @property
    def kv_used(self) -> int:
        return sum(s.prefilled + max(0, len(s.tokens) - 1) for s in self.running)

    # -- admission's prediction (under the lock) ----------------------------------------------------------

    def _pending(self, s: Seq, at_ns: int, now: int, scale: float) -> Pending:
        expected = expected_output(self.costs, s.req.max_tokens)
        if s.state == "decode":
            return Pending(0, max(1, expected - len(s.tokens)), s.req.kv_tokens, decoding=True,
                           slack_s=self._slack_s(s, at_ns))  # fmt: skip
        aim = self._aim_s(s, now, scale)
        return Pending(s.prompt_len - s.prefilled, expected - 1, s.req.kv_tokens,
                       aim_s=None if aim is None else aim - (at_ns - now) / 1e9)  # fmt: skip

    def _aim_s(self, s: Seq, now: int, scale: float) -> float | None:
        """Seconds of forecast (unscaled) from ``now`` to when admission planned ``s``'s first token: inside
        ``ttft_target_fraction`` of its time to the deadline, less ``margin_s``, as :meth:`submit` planned it;
        None without a deadline or where the cap does not yield (genserve/budget.py)."""
        if s.req.ttft_deadline_ns is None or self.budget is None or not self.budget.yields:
            return None
        cfg = self.cfg
        planned_ns = s.arrival_ns + int((cfg.ttft_target_fraction * (s.req.ttft_deadline_ns - s.arrival_ns) / 1e9
                                         - cfg.margin_s) * 1e9)  # fmt: skip
        return (planned_ns - now) / 1e9 / scale

    def _slack_s(self, s: Seq, at_ns: int) -> float:
        """``s``'s TPOT slack at ``at_ns`` (genserve/budget.py); 0 without a budget."""
        if self.budget is None or not s.token_ns:
            return 0.0
        return self.budget.target_s * (len(s.tokens) - 1) - (at_ns - s.token_ns[0]) / 1e9

    def max_batch(self) -> int:
        """The largest running batch: ``max_num_seqs``, and with a TPOT budget only as many sequences as the
        learnt decode step keeps within the planned TPOT (at least one)."""
        n = self.cfg.max_num_seqs
        if self.budget is None or not self.costs.decode.by_size:
            return n
        while n > 1 and self.costs.decode_s(n) > self.budget.target_s:
            n -= 1
        return n

    def _step_budget(self, prefilling: list[Seq], decoding: list[Seq], now: int) -> int:
        """This step's prefill budget in tokens (fixed, or from the decoders' TPOT slack and, where the ITL cap
        yields, the prompts' deadlines)."""
        if self.budget is None:
            return self.cfg.prefill_chunk_tokens
        costs = self.costs
        more = (expected_output(costs, s.req.max_tokens) - len(s.tokens) - 1 for s in decoding)
        slack = (self._slack_s(s, now) for s in decoding)
        full = self.budget.later_step_s(costs, self.max_batch())
        d = costs.decode_s(len(decoding))
        need = 0
        if self.budget.yields and decoding and prefilling:
            scale = self.forecast_error.scale(now)
            ahead = ((s.prompt_len - s.prefilled, self._aim_s(s, now, scale)) for s in prefilling)
            need = self.budget.deadline_tokens(ahead, d, costs)
        return self.budget.tokens(zip(slack, more, strict=True), d, full, costs, need)

    def _predicted_ttft_s(
        self,
        req: GenRequest,
        now: int | None = None,
        horizon_s: float = float("inf"),
        scale: float = 1.0,
        aim_s: float | None = None,
    ) -> float:
        """Seconds from ``now`` to ``req``'s first token if queued now (genserve/forecast.py); ``scale``: the
        forecast's error scale and ``aim_s`` the (scaled) seconds admission would plan it for, both for the ITL
        cap's yield to deadlines in the replay (genserve/budget.py)."""
        now = self.now_ns() if now is None else now
        rest_s = 0.0 if self._step_eta_ns is None else max(0, self._step_eta_ns - now) / 1e9
        at = now + int(rest_s * 1e9)
        running = [self._pending(s, at, now, scale) for s in self.running if not (s.finished or s.cancel_reason)]
        waiting = [self._pending(s, at, now, scale) for s in self.waiting]
        expected = expected_output(self.costs, req.max_tokens)
        prompt = len(req.prompt_ids) - self.cached_prefix(req)  # a cached prefix is no prefill work
        yields = aim_s is not None and self.budget is not None and self.budget.yields
        target_aim = aim_s / scale - rest_s if yields and aim_s is not None else None
        waiting.append(Pending(prompt, expected - 1, req.kv_tokens, target=True, aim_s=target_aim))
        cfg = self.cfg
        return rest_s + forecast_ttft_s(
            running, waiting, sum(p.kv_tokens for p in running), max_num_seqs=self.max_batch(),
            kv_budget_tokens=cfg.kv_budget_tokens, prefill_chunk_tokens=cfg.prefill_chunk_tokens, costs=self.costs,
            horizon_s=horizon_s - rest_s, budget=self.budget,
        )  # fmt: skip

    # -- the worker's side ----------------------------------------------------------------------------------

    def step(self) -> StepReport | None:
        """One iteration (see the module docstring); None when there was nothing to do."""
        start = self.now_ns()
        with self._lock:
            self._retarget(start)
            cancelled = self._apply_cancellations(start)
            joined = self._admit(start)
            prefilling = [s for s in self.running if s.state == "prefill"]
            decoding = [s for s in self.running if s.state == "decode"]
            budget = self._step_budget(prefilling, decoding, start)
            self._step_eta_ns = start + int(self._step_cost_s(prefilling, len(decoding), budget) * 1e9)
        for s in cancelled:
            self.engine.release(s)
        if not (prefilling or decoding or cancelled):
            self._step_eta_ns = None
            return None
        if self.fused:
            return self._fused_step(start, prefilling, decoding, budget, cancelled, joined)
        ended: list[Seq] = []  # finished by this step's tokens
        tokens: list[tuple[Seq, int]] = []
        # prefill: the oldest sequences first, up to the token budget
        t0 = self.now_ns()
        prefill_tokens = 0
        for s in prefilling:
            if budget <= 0:
                break
            end = min(s.prompt_len, s.prefilled + budget)
            c0 = self.now_ns()
            first = self.engine.prefill(s, s.prefilled, end)
            c1 = self.now_ns()
            self.costs.observe_prefill(end - s.prefilled, (c1 - c0) / 1e9)
            budget -= end - s.prefilled
            prefill_tokens += end - s.prefilled
            s.prefilled = end
            if end == s.prompt_len:
                self._first(s, first, c1, tokens, ended)
        t1 = self.now_ns()
        # decode: one forward over the sequences whose prefill ended before this step
        live = [s for s in decoding if not s.finished]
        if live:
            out = self.engine.decode(live)
            t2 = self.now_ns()
            self.costs.observe_decode(len(live), (t2 - t1) / 1e9)
            for s, tok in zip(live, out, strict=True):
                self._take(s, tok, t2, tokens, ended)
        else:
            t2 = t1
        return self._finish_step(start, t0, t1, t2, prefill_tokens, len(live), tokens, ended, cancelled, joined)

    def _finish_step(
        self, start: int, t0: int, t1: int, t2: int, prefill_tokens: int, batch: int, tokens: list[tuple[Seq, int]],
        ended: list[Seq], cancelled: list[Seq], joined: list[Seq],
    ) -> StepReport:  # fmt: skip
        """Retire what ended, feed admission's forecast error, and report the step (prefill t0..t1, decode t1..t2)."""
        with self._lock:
            for s in ended:
                if s in self.running:
                    self.running.remove(s)
                    self.kv_reserved -= s.req.kv_tokens
            running, waiting, reserved = len(self.running), len(self.waiting), self.kv_reserved
            self._step_eta_ns = None
            for s, _tok in tokens:  # the first tokens of this step reach their clients now, at its end
                if s.forecast_s is not None:
                    self.forecast_error.observe(t2, s.forecast_s, (t2 - s.arrival_ns) / 1e9)
                    s.forecast_s = None
        for s in ended:
            self.engine.release(s)
            self.costs.observe_finish(len(s.tokens), s.req.max_tokens)
            self._observe_tpot(s)
        return StepReport(
            start, t2, prefill_tokens, t1 - t0, batch, t2 - t1, tuple(tokens), (*cancelled, *ended), tuple(joined),
            running, waiting, reserved, self.kv_used,
        )  # fmt: skip

    def _fused_step(
        self, start: int, prefilling: list[Seq], decoding: list[Seq], budget: int, cancelled: list[Seq],
        joined: list[Seq],
    ) -> StepReport:  # fmt: skip
        """The step as one forward (a fused engine's ``mixed``): the chunks of the oldest prompts up to the budget
        and a token for every decoding sequence. Every token of the step is chosen at its end. Costs: a step with
        chunks and decoders teaches the prefill's cost per token over the decode batch's predicted cost (the
        forward's fixed cost is in it); a step without decoders, the prefill's fixed + per-token cost as a
        prefill forward; a step without chunks, the decode step. Its report splits the forward the same way."""
        chunks: list[tuple[Seq, int, int]] = []
        for s in prefilling:
            if budget <= 0:
                break
            end = min(s.prompt_len, s.prefilled + budget)
            chunks.append((s, s.prefilled, end))
            budget -= end - s.prefilled
        live = [s for s in decoding if not s.finished]
        n_prefill = sum(e - b for _, b, e in chunks)
        drafts = self._drafts(live)
        drafted = kept = 0
        t0 = self.now_ns()
        if getattr(self.engine, "drafts_itself", False):  # a model draft inside the engine (genserve/ort_engine.py)
            firsts, outs, drafted, kept = self.engine.mixed_drafted(chunks, live)  # type: ignore[attr-defined]
            self.spec_proposed += drafted
            self.spec_accepted += kept
        elif drafts is None:
            firsts, out = self.engine.mixed(chunks, live)  # type: ignore[attr-defined]
            outs = [[t] for t in out]
        else:
            firsts, outs = self.engine.mixed_spec(chunks, live, drafts)  # type: ignore[attr-defined]
            drafted, kept = sum(len(d) for d in drafts), sum(len(o) - 1 for o in outs)
            self.spec_proposed += drafted
            self.spec_accepted += kept
        t2 = self.now_ns()
        total_s = (t2 - t0) / 1e9
        if chunks and live:
            decode_s = min(total_s, self.costs.decode_s(len(live)))
            self.costs.observe_prefill(n_prefill, total_s, fixed_s=decode_s)
        elif chunks:
            decode_s = 0.0
            self.costs.observe_prefill(n_prefill, total_s)
        else:
            decode_s = total_s
            self.costs.observe_decode(len(live), total_s)
        t1 = t2 - int(decode_s * 1e9)
        ended: list[Seq] = []
        tokens: list[tuple[Seq, int]] = []
        for (s, _b, end), first in zip(chunks, firsts, strict=True):
            s.prefilled = end
            if end == s.prompt_len:
                self._first(s, first, t2, tokens, ended)
        for s, toks in zip(live, outs, strict=True):
            for tok in toks:  # more than one: drafts the model agreed with (speculative decoding)
                if not s.finished:
                    self._take(s, tok, t2, tokens, ended)
        rep = self._finish_step(start, t0, t1, t2, n_prefill, len(live), tokens, ended, cancelled, joined)
        return dataclasses.replace(rep, drafted=drafted, draft_accepted=kept) if drafted else rep

    def _drafts(self, live: list[Seq]) -> list[tuple[int, ...]] | None:
        """Prompt-lookup drafts for the greedy sequences of a speculative step (``cfg.spec_lookup_k``), at most what
        each has left to generate after this step's own token; None: speculation off, more than
        ``cfg.spec_max_batch`` sequences decoding, or no draft found."""
        k = self.cfg.spec_lookup_k
        if not k or not live or len(live) > self.cfg.spec_max_batch or not hasattr(self.engine, "mixed_spec"):
            return None
        from latencylab.gen.drafts import lookup

        out = []
        for s in live:
            n = min(k, s.req.max_tokens - len(s.tokens) - 1)
            greedy = s.req.sampling.temperature <= 0
            out.append(tuple(lookup((*s.req.prompt_ids, *s.tokens), n)) if greedy and n > 0 else ())
        return out if any(out) else None

    def _observe_tpot(self, s: Seq) -> None:
        """A finished reply's TPOT against the plan in force at its end (the TPOT margin's evidence)."""
        if self.budget is None or len(s.token_ns) < 3 or s.finish_reason not in ("stop", "length"):
            return
        tpot = (s.token_ns[-1] - s.token_ns[0]) / (len(s.token_ns) - 1) / 1e9
        if self.tpot_error.is_near(tpot, self.budget.target_s):
            self.tpot_error.observe(s.token_ns[-1], self.budget.target_s, tpot)

    def _retarget(self, now: int) -> None:
        """The plan steps use now: the configured target over the TPOT plan's recent error (at least 1)."""
        if self.planned is None:
            return
        scale = self.tpot_error.scale(now)
        if scale != self.planned.target_s / self.budget.target_s:  # type: ignore[union-attr]
            self.budget = dataclasses.replace(self.planned, target_s=self.planned.target_s / scale)

    def _step_cost_s(self, prefilling: list[Seq], decode_batch: int, budget: int) -> float:
        """The predicted cost of a step that prefills ``prefilling`` (``budget`` tokens) and decodes a batch."""
        total = self.costs.decode_s(decode_batch)
        shares = decode_batch > 0
        for s in prefilling:
            if budget <= 0:
                break
            take = min(s.prompt_len - s.prefilled, budget)
            total += self.costs.chunk_s(take, shares)
            budget -= take
            shares = True
        return total

    def _apply_cancellations(self, now: int) -> list[Seq]:
        out = list(self._cancelled)
        self._cancelled = []
        for s in list(self.running):
            if s.cancel_reason:
                self.running.remove(s)
                self.kv_reserved -= s.req.kv_tokens
                out.append(s)
        for s in out:
            s.state = "finished"
            s.finish_reason = s.cancel_reason
            s.finished_ns = now
        return out

    def _admit(self, now: int) -> list[Seq]:
        joined = []
        cfg = self.cfg
        limit = self.max_batch()
        while self.waiting and len(self.running) < limit:
            head = self.waiting[0]
            if self.kv_reserved + head.req.kv_tokens > cfg.kv_budget_tokens:
                break  # first come first served: the head waits for room, nothing overtakes it
            self.waiting.popleft()
            head.state = "prefill"
            head.joined_ns = now
            self.kv_reserved += head.req.kv_tokens
            self.running.append(head)
            joined.append(head)
        return joined

    def _first(self, s: Seq, first: int | None, t: int, tokens: list[tuple[Seq, int]], finished: list[Seq]) -> None:
        """``s``'s prompt is in: its first token, chosen at ``t``; it decodes from the next step."""
        if first is None:
            raise RuntimeError("the engine gave no first token at the end of a prompt")
        s.state = "decode"
        s.first_token_ns = t
        self._take(s, first, t, tokens, finished)

    def _take(self, s: Seq, tok: int, t: int, tokens: list[tuple[Seq, int]], finished: list[Seq]) -> None:
        s.tokens.append(tok)
        s.token_ns.append(t)
        tokens.append((s, tok))
        reason = ""
        if tok in s.req.eos_ids:
            reason = "stop"
        elif len(s.tokens) >= s.req.max_tokens:
            reason = "length"
        if reason:
            s.state = "finished"
            s.finish_reason = reason
            s.finished_ns = t
            finished.append(s)

"""Admission of the continuous-batching scheduler (fake model, fake clock): the TTFT forecast replays the
schedule (chunked prefill behind a busy batch, the batch's decode steps, slots that free when replies end),
requests that would miss their TTFT deadline are refused with their forecast as Retry-After, and the error of
forecasts near their deadline scales the next ones."""

from __future__ import annotations

import pytest

from latencylab.clock import FakeClock
from latencylab.genserve.fake import EOS, FakeEngine
from latencylab.genserve.forecast import ForecastError
from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig, Seq
from latencylab.serve.admission import Shed

MS = 1_000_000
S = 1_000_000_000


def req(prompt_len: int, max_tokens: int, deadline: int | None = None, reply: int = 10_000) -> GenRequest:
    """A request whose fake reply runs to ``max_tokens`` (the reply length is the first prompt id)."""
    return GenRequest((reply,) + (7,) * (prompt_len - 1), max_tokens, eos_ids=frozenset({EOS}),
                      ttft_deadline_ns=deadline)  # fmt: skip


def make(engine_scale: float = 1.0, **cfg: float) -> tuple[Scheduler, FakeClock]:
    """A scheduler whose cost model knows the fake engine's costs exactly (the engine's are ``engine_scale``
    times them): prefill 10 ms a forward + 2 ms a token, decode 60 ms + 8 ms a sequence."""
    clock = FakeClock()
    k = engine_scale
    eng = FakeEngine(clock, prefill_ns_per_token=int(2 * MS * k), prefill_overhead_ns=int(10 * MS * k),
                     decode_base_ns=int(60 * MS * k), decode_ns_per_seq=int(8 * MS * k))  # fmt: skip
    sc = SchedulerConfig(**{"max_num_seqs": 8, "prefill_chunk_tokens": 128, "margin_s": 0.0, **cfg})  # type: ignore[arg-type]
    s = Scheduler(eng, sc, clock)
    s.costs.fit_prefill([(8, 0.010 + 8 * 0.002), (128, 0.010 + 128 * 0.002)])
    for n in range(1, sc.max_num_seqs + 1):
        s.costs.observe_decode(n, 0.060 + 0.008 * n)
    return s, clock


def busy(s: Scheduler, decoding: int = 5, waiting_prompts: tuple[int, ...] = (500, 500)) -> list[Seq]:
    """``decoding`` sequences decoding (48-token replies) and long prompts queued behind them."""
    seqs = [s.submit(req(40, 48)) for _ in range(decoding)]
    while any(q.state != "decode" for q in seqs):
        s.step()
    return seqs + [s.submit(req(n, 48)) for n in waiting_prompts]


def first_token_delivered(s: Scheduler, seq: Seq) -> int:
    """Step until ``seq`` has its first token; the end of that step (when its client gets it), ns."""
    while True:
        rep = s.step()
        assert rep is not None
        if any(q is seq for q, _ in rep.tokens):
            return rep.end_ns


def test_the_forecast_is_the_schedule_replayed_exactly_on_known_costs() -> None:
    s, clock = make()
    busy(s)
    now = clock.now_ns
    forecast = s.predicted_ttft_s(req(300, 32))
    new = s.submit(req(300, 32))
    # behind 5 decoding sequences and two 500-token prompts: 11 prefill steps of 128 tokens, each with a decode
    # step of the growing batch, not the bare 2.7-s prefill; at the step boundary the replay is exact
    assert (first_token_delivered(s, new) - now) / S == pytest.approx(forecast, abs=1e-9)
    assert forecast > 1.3 * s.costs.prefill_s(1300)


def test_the_forecast_waits_for_a_slot_when_the_batch_is_full() -> None:
    s, clock = make(max_num_seqs=4)
    busy(s, decoding=4, waiting_prompts=(200,))
    now = clock.now_ns
    forecast = s.predicted_ttft_s(req(100, 16))
    new = s.submit(req(100, 16))
    got = (first_token_delivered(s, new) - now) / S
    # the four replies run 48 tokens each before a slot frees, then the 200-token prompt and this one
    assert got == pytest.approx(forecast, abs=1e-9) and got > 40 * s.costs.decode_s(4)


def test_a_request_that_cannot_meet_its_deadline_behind_a_busy_batch_is_refused_with_retry_after() -> None:
    s, clock = make()
    busy(s)
    forecast = s.predicted_ttft_s(req(300, 32))
    # its own prefill alone (0.61 s) fits a 1.5-s deadline; behind the batch it does not
    assert s.costs.prefill_s(300) < 1.5 < forecast
    with pytest.raises(Shed) as shed:
        s.submit(req(300, 32, deadline=clock.now_ns + int(1.5 * S)))
    assert shed.value.reason == "deadline" and shed.value.retry_after_s == pytest.approx(forecast)
    assert len(s.waiting) == 2  # refused before it queued
    # the refusal was right: the same request admitted without a deadline gets its first token after 1.5 s
    now = clock.now_ns
    late = s.submit(req(300, 32))
    assert (first_token_delivered(s, late) - now) / S > 1.5


def test_admission_plans_inside_the_target_fraction_of_the_deadline_and_meets_it() -> None:
    s, clock = make(ttft_target_fraction=0.9)
    busy(s)
    forecast = s.predicted_ttft_s(req(300, 32))
    with pytest.raises(Shed):  # inside the deadline, but not inside 90% of it
        s.submit(req(300, 32, deadline=clock.now_ns + int(forecast / 0.95 * S)))
    now = clock.now_ns
    deadline = now + int(forecast / 0.85 * S)
    ok = s.submit(req(300, 32, deadline=deadline))
    assert first_token_delivered(s, ok) <= deadline


def test_the_rest_of_the_step_in_progress_counts() -> None:
    s, clock = make()
    busy(s, decoding=3, waiting_prompts=())
    step_s = s.costs.decode_s(3)
    idle = s.predicted_ttft_s(req(100, 8))
    # as if asked from the event loop 10 ms into a decode step of the three
    s._step_eta_ns = clock.now_ns + int(step_s * 1e9)
    clock.advance(10 * MS)
    assert s.predicted_ttft_s(req(100, 8)) == pytest.approx(idle + step_s - 0.010)


def test_forecast_errors_near_the_deadline_scale_the_next_admissions() -> None:
    # the engine is 1.5x slower than the cost model believes (a machine busier than at warm-up)
    s, clock = make(engine_scale=1.5)
    s.costs.alpha = 0.0  # freeze the cost model: only the forecast error may correct admission here
    s.costs.decode.alpha = 0.0
    assert s.forecast_error.scale(clock.now_ns) == 1.0
    for _ in range(4):  # requests admitted near their deadline (their planned TTFT is over half of what it allows)
        busy(s, decoding=2, waiting_prompts=())
        forecast = s.predicted_ttft_s(req(300, 8))
        q = s.submit(req(300, 8, deadline=clock.now_ns + int(2 * forecast * S)))
        assert q.forecast_s == pytest.approx(forecast)  # kept: it was near
        while not q.finished or s.running:
            s.step()
    scale = s.forecast_error.scale(clock.now_ns)
    assert scale == pytest.approx(1.5, rel=0.05)  # actual / forecast of those requests
    busy(s, decoding=2, waiting_prompts=())
    forecast = s.predicted_ttft_s(req(300, 8))
    with pytest.raises(Shed) as shed:  # the raw forecast fits 90% of this deadline, the scaled one does not
        s.submit(req(300, 8, deadline=clock.now_ns + int(forecast / 0.8 * S)))
    assert shed.value.retry_after_s == pytest.approx(forecast * scale)


def test_the_forecast_error_ignores_far_requests_clamps_and_forgets() -> None:
    fe = ForecastError(q=0.9, window=10, near=0.5, max_scale=2.0, max_age_s=60.0)
    assert not fe.is_near(0.1, 4.0) and fe.is_near(2.5, 4.0)
    for i in range(10):
        fe.observe(i * S, 1.0, 1.1 + 0.01 * i)
    assert fe.scale(10 * S) == pytest.approx(1.18)  # the 9th of 10 ratios (q = 0.9)
    fe.observe(11 * S, 1.0, 0.5)
    assert fe.scale(11 * S) == pytest.approx(1.18)  # one fast request among ten is no reason to trust more
    for i in range(10):
        fe.observe((12 + i) * S, 1.0, 0.7)
    assert fe.scale(22 * S) == 1.0  # never below the forecast itself
    fe.observe(23 * S, 1.0, 9.0)
    assert fe.scale(23 * S) == 1.0  # one stall is in the top decile of ten, not its 9th ratio
    for i in range(10):
        fe.observe((24 + i) * S, 1.0, 9.0)
    assert fe.scale(34 * S) == 2.0  # clamped
    assert fe.scale(200 * S) == 1.0  # old evidence expires


def test_bad_admission_settings() -> None:
    with pytest.raises(ValueError, match="ttft_target_fraction"):
        SchedulerConfig(ttft_target_fraction=0.0)
    with pytest.raises(ValueError, match="forecast_quantile"):
        SchedulerConfig(forecast_quantile=1.5)


def test_a_refusal_is_kept_with_what_decided_it() -> None:
    """``recent_sheds`` (served under GET /v2/models/{m}/guard, "admission"): the forecast, its scale, the
    allowance and the batch's state of each refusal on the deadline, so a refusal can be checked afterwards."""
    s, clock = make()
    busy(s)
    forecast = s.predicted_ttft_s(req(300, 32))
    with pytest.raises(Shed):
        s.submit(req(300, 32, deadline=clock.now_ns + int(1.5 * S)))
    (d,) = s.recent_sheds
    assert d["forecast_s"] == pytest.approx(forecast, rel=1e-3) and d["scale"] == 1.0
    assert d["allowed_s"] == pytest.approx(0.9 * 1.5, rel=1e-3)  # ttft_target_fraction of the time left
    assert d["prompt_tokens"] == 300 and d["running"] == 5 and d["waiting"] == 2
    assert d["prefill_ms_per_token"] == pytest.approx(2.0) and d["prefill_overhead_ms"] == pytest.approx(10.0)
    assert d["decode_ms"][1] == pytest.approx(68.0)


def test_every_admitted_request_with_a_deadline_keeps_its_forecast_and_the_metric_reads_actual_over_it() -> None:
    from latencylab.genserve.metrics import GenMetrics

    s, clock = make(engine_scale=1.5)  # the engine runs 1.5x the costs the model believes
    m = GenMetrics("gen", s.cfg.kv_budget_tokens)
    far = s.submit(req(40, 4, deadline=clock.now_ns + 100 * S))  # far from its deadline: not a ForecastError sample
    assert far.predicted_s is not None and far.forecast_s is None
    none = s.submit(req(40, 4))
    assert none.predicted_s is None  # no deadline, no forecast
    while (rep := s.step()) is not None:
        m.observe_step(rep)
    ratio = (far.first_token_ns - far.arrival_ns) / 1e9 / far.predicted_s
    assert ratio > 1.2  # the engine was slower than the model
    text = m.exposition().decode()
    assert 'latencylab_gen_admission_forecast_ratio_count{model="gen"} 1.0' in text
    assert f'latencylab_gen_admission_forecast_ratio_sum{{model="gen"}} {ratio}' in text

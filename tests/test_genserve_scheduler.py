"""The continuous-batching scheduler on a fake model and a fake clock: exact steps, exact times."""

from __future__ import annotations

import pytest

from latencylab.clock import FakeClock
from latencylab.genserve.fake import EOS, FakeEngine
from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig, TooLarge
from latencylab.serve.admission import Shed

MS = 1_000_000


def req(reply: int, prompt_len: int = 4, max_tokens: int = 100, deadline: int | None = None) -> GenRequest:
    """A request whose fake reply is ``reply`` tokens long (the fake engine reads it off the first prompt id)."""
    return GenRequest(
        (reply,) + (7,) * (prompt_len - 1), max_tokens, eos_ids=frozenset({EOS}), ttft_deadline_ns=deadline
    )


def make(**cfg: int) -> tuple[Scheduler, FakeEngine, FakeClock]:
    clock = FakeClock()
    eng = FakeEngine(clock)
    return Scheduler(eng, SchedulerConfig(**cfg), clock), eng, clock


def run_all(s: Scheduler, limit: int = 1000) -> int:
    n = 0
    while s.step() is not None:
        n += 1
        assert n < limit
    return n


def test_sequences_join_at_any_step_and_leave_when_finished() -> None:
    s, eng, _clock = make(max_num_seqs=4)
    a = s.submit(req(3))
    r1 = s.step()
    assert r1 is not None and r1.joined == (a,) and [t for _, t in r1.tokens] == [1000]
    b = s.submit(req(4))  # joins while a is decoding
    r2 = s.step()
    assert r2 is not None and r2.joined == (b,)
    assert eng.calls[-2:] == [("prefill", b.id, 0, 4), ("decode", (a.id,))]
    r3 = s.step()  # both decode in one forward; a reaches EOS (its 3rd token) and leaves
    assert eng.decodes()[-1] == (a.id, b.id)
    assert r3 is not None and r3.finished == (a,) and a.tokens == [1000, 1001, EOS] and a.finish_reason == "stop"
    assert ("release", a.id) in eng.calls
    s.step()
    assert eng.decodes()[-1] == (b.id,)  # a is gone from the batch the very next step
    run_all(s)
    assert b.tokens == [1000, 1001, 1002, EOS] and s.running == [] and s.kv_reserved == 0
    # times: step 1 = prefill 4 ms; step 2 = prefill 4 ms + decode(1) 22 ms
    assert a.first_token_ns == 4 * MS and a.token_ns[1] == 4 * MS + 4 * MS + 22 * MS


def test_max_num_seqs_bounds_the_batch_and_the_rest_queue() -> None:
    s, eng, _ = make(max_num_seqs=2)
    seqs = [s.submit(req(2 + i)) for i in range(5)]
    s.step()
    assert len(s.running) == 2 and len(s.waiting) == 3
    run_all(s)
    assert max(len(d) for d in eng.decodes()) == 2
    assert all(q.finished and q.finish_reason == "stop" for q in seqs)
    # a queued sequence joins the step after a slot frees
    assert seqs[2].joined_ns == seqs[0].finished_ns


def test_the_kv_budget_holds_sequences_back_until_room_frees() -> None:
    # each request reserves 4 + 10 - 1 = 13 positions; a budget of 20 runs one at a time
    s, eng, _ = make(max_num_seqs=8, kv_budget_tokens=20)
    a = s.submit(req(3, max_tokens=10))
    b = s.submit(req(3, max_tokens=10))
    s.step()
    assert s.running == [a] and list(s.waiting) == [b] and s.kv_reserved == 13
    run_all(s)
    assert b.joined_ns is not None and a.finished_ns is not None and b.joined_ns >= a.finished_ns
    assert all(len(d) == 1 for d in eng.decodes())
    with pytest.raises(TooLarge, match="KV budget of 20"):
        s.submit(req(3, prompt_len=15, max_tokens=10))


def test_chunked_prefill_spreads_a_long_prompt_over_steps_without_stalling_decode() -> None:
    s, eng, _clock = make(max_num_seqs=4, prefill_chunk_tokens=128)
    a = s.submit(req(50))
    s.step()
    b = s.submit(req(3, prompt_len=300))
    for _ in range(3):
        s.step()
    prefills = [c for c in eng.calls if c[0] == "prefill" and c[1] == b.id]
    assert prefills == [("prefill", b.id, 0, 128), ("prefill", b.id, 128, 256), ("prefill", b.id, 256, 300)]
    # a got a token in each of those steps: its gaps never exceed decode(1) + one chunk of prefill
    gaps = [t1 - t0 for t0, t1 in zip(a.token_ns, a.token_ns[1:], strict=False)]
    assert len(gaps) == 3 and max(gaps) == 22 * MS + 128 * MS
    assert b.first_token_ns == a.token_ns[-1] - 22 * MS  # end of the last chunk, before the decode forward


def test_a_cancelled_sequence_frees_its_slot_at_the_next_step() -> None:
    s, eng, _ = make(max_num_seqs=2)
    a, b, c = (s.submit(req(40)) for _ in range(3))
    s.step()
    s.step()
    assert s.running == [a, b] and list(s.waiting) == [c]
    made = len(a.tokens)
    s.cancel(a)  # the client left
    r = s.step()
    assert r is not None and a in r.finished and a.finish_reason == "cancelled"
    assert a.cancel_ns is not None and a.finished_ns == r.start_ns >= a.cancel_ns  # freed at the next step's start
    assert len(a.tokens) == made  # nothing computed for it after the cancel
    assert c in r.joined  # the slot went to the next in line in the same step
    assert a.id not in eng.decodes()[-1] and ("release", a.id) in eng.calls
    waiting = s.submit(req(5))
    s.cancel(waiting)  # a queued one leaves the queue at once
    assert waiting not in s.waiting
    r = s.step()
    assert (
        r is not None and waiting in r.finished and not any(c[1] == waiting.id for c in eng.calls if c[0] == "prefill")
    )


def test_stop_ends_a_sequence_as_a_normal_finish() -> None:
    s, _, _ = make()
    a = s.submit(req(40))
    s.step()
    s.stop(a)
    r = s.step()
    assert r is not None and r.finished == (a,) and a.finish_reason == "stop" and len(a.tokens) == 1


def test_max_tokens_ends_with_length() -> None:
    s, _, _ = make()
    a = s.submit(req(40, max_tokens=3))
    run_all(s)
    assert a.tokens == [1000, 1001, 1002] and a.finish_reason == "length"


def test_admission_predicts_ttft_and_sheds_what_cannot_meet_its_deadline() -> None:
    s, _, clock = make(max_num_seqs=2, prefill_chunk_tokens=128)
    s.costs.prefill_per_token_s = 0.001
    s.costs.observe_decode(1, 0.022)
    s.costs.observe_decode(2, 0.024)
    # empty server: TTFT = own prefill, 100 tokens x 1 ms
    assert s.predicted_ttft_s(req(3, prompt_len=100)) == pytest.approx(0.1)
    s.submit(req(30, prompt_len=100, max_tokens=30))
    s.submit(req(30, prompt_len=100, max_tokens=30))
    # both slots taken by sequences of 30 tokens: the third waits for a slot (their prefills and 29 decode
    # steps of the pair), then its own prefill (0.1 s); more than any one of those alone
    predicted = s.predicted_ttft_s(req(3, prompt_len=100))
    assert predicted > 29 * 0.024 + 0.2 + 0.1
    with pytest.raises(Shed) as shed:
        s.submit(req(3, prompt_len=100, deadline=clock.now_ns + int(predicted * 0.9e9)))
    assert shed.value.reason == "deadline" and shed.value.retry_after_s == pytest.approx(predicted)
    ok = s.submit(req(3, prompt_len=100, deadline=clock.now_ns + int((predicted + 0.02) / 0.85 * 1e9)))
    assert ok in s.waiting
    # on the fake model's exact costs, the first token reaches its client (the end of its step) as predicted
    while True:
        rep = s.step()
        assert rep is not None
        if any(q is ok for q, _ in rep.tokens):
            break
    assert rep.end_ns / 1e9 == pytest.approx(predicted, abs=1e-9)


def test_the_queue_bound_sheds_with_queue_full() -> None:
    s, _, _ = make(max_num_seqs=1, max_waiting=2)
    for _ in range(2):
        s.submit(req(3))
    with pytest.raises(Shed) as shed:
        s.submit(req(3))
    assert shed.value.reason == "queue_full"


def test_finished_output_lengths_teach_admission_how_soon_slots_free() -> None:
    s, _, _ = make(max_num_seqs=1)
    for _ in range(5):
        s.submit(req(2, max_tokens=100))  # replies end at EOS after 2 of 100 tokens
    run_all(s)
    assert s.costs.output_fraction < 0.5

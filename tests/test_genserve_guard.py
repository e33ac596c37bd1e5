"""The generative SLO guard on the fake engines and a fake clock: TTFT/TPOT usage, the ladder fp32 -> int8 ->
capped -> cache with labelled answers, shadow probes, hysteresis, the alarm, and recovery on the timer when
traffic stops. The service is driven by hand (``run_once``: what the step thread does), so every time is exact."""

from __future__ import annotations

from typing import Any

import pytest

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.genserve.api import GenParams
from latencylab.genserve.fake import FakeEngine, FakeTokenizer
from latencylab.genserve.guard import GenGuard
from latencylab.genserve.ladder import AnswerCache, plan_ladder
from latencylab.genserve.scheduler import SchedulerConfig
from latencylab.genserve.service import GenServeConfig, GenService, TokenStream
from latencylab.serve.guard import Alarm

MS = 1_000_000
GUARD = {"window_s": 10.0, "bucket_s": 1.0, "dwell_s": 1.0, "min_samples": 4, "probe_fraction": 0.5,
         "probe_min_samples": 2}  # fmt: skip


def engine(clock: FakeClock, decode_ms: float) -> FakeEngine:
    return FakeEngine(clock, prefill_ns_per_token=100_000, decode_base_ns=int(decode_ms * MS), decode_ns_per_seq=0,
                      reply_len=lambda s: 50)  # fmt: skip


def make(
    fp32_ms: float, int8_ms: float, ladder: tuple[str, ...] = ("fp32", "int8", "capped", "cache"),
    every_s: float = 1e9,
) -> Any:  # fmt: skip
    """The service over two fake engines; ``every_s``: how often ``run_once`` lets the guard decide (by default
    never after its first call: the test calls ``evaluate_guard`` where it wants a decision)."""
    clock = FakeClock()
    fp32, int8 = engine(clock, fp32_ms), engine(clock, int8_ms)
    alarms: list[Alarm] = []
    cfg = GenServeConfig(
        sched=SchedulerConfig(max_num_seqs=4), ladder=ladder, ttft_slo_s=2.0, tpot_slo_s=0.25, guard=GUARD,
        cap_tokens=4, probe_tokens=3, context_window=4096, guard_every_s=every_s,
    )  # fmt: skip
    svc = GenService(cfg, FakeTokenizer(), fp32, frozenset({2}), clock, standby={"int8": int8}, on_alarm=alarms.append)
    return svc, clock, fp32, int8, alarms


def params(prompt: str = "hello", max_tokens: int = 8) -> GenParams:
    return GenParams(prompt, None, max_tokens, 0.0, 1.0, None, (), False, False, None)


def ask(svc: GenService, clock: FakeClock, prompt: str = "hello", max_tokens: int = 8) -> TokenStream:
    """One request, served to its end (and any shadow probe beside it)."""
    stream = svc.open(params(prompt, max_tokens), clock.now_ns)
    while svc.run_once():
        pass
    assert stream.finish, "the request did not finish"
    return stream


def served_by(eng: FakeEngine) -> int:
    return sum(1 for c in eng.calls if c[0] == "prefill")


def test_usage_is_the_worse_of_ttft_and_tpot_in_percent_of_their_slos() -> None:
    g = GenGuard(["fp32", "int8"], ttft_slo_s=2.0, tpot_slo_s=0.25)
    assert g.usage(1.0, 0.1) == pytest.approx(50.0)  # TTFT 50 %, TPOT 40 %
    assert g.usage(0.5, 0.3) == pytest.approx(120.0)  # TPOT 120 %
    assert g.usage(3.0, None) == pytest.approx(150.0)  # one token: no TPOT
    with pytest.raises(LatencyLabError, match="sets it"):
        GenGuard(["a", "b"], 2.0, 0.25, {"slo_ms": 5})


def test_a_ladder_that_cannot_be_served_is_refused() -> None:
    assert [r.engine for r in plan_ladder(["fp32", "int8", "capped", "cache"], ["fp32", "int8"], 32)] == [
        "fp32", "int8", "int8", "int8",
    ]  # fmt: skip
    capped = plan_ladder(["fp32", "capped"], ["fp32"], 32)[1]
    assert capped.engine == "fp32" and capped.cap == 32
    for bad, needle in ((["cache", "fp32"], "must start"), (["fp32", "cache", "int8"], "last rung"),
                        (["fp32", "bf16"], "unknown ladder rung 'bf16'"), (["fp32", "fp32"], "distinct")):  # fmt: skip
        with pytest.raises(LatencyLabError, match=needle):
            plan_ladder(bad, ["fp32", "int8"], 32)


def test_serve_ladder_flag_is_checked_before_the_model_loads() -> None:
    import argparse

    from latencylab.genserve.server import config_from_args

    assert config_from_args(argparse.Namespace(ladder="fp32, int8,capped,cache")).ladder == (
        "fp32", "int8", "capped", "cache",
    )  # fmt: skip
    assert config_from_args(argparse.Namespace()).ladder == ("fp32",)  # no flag: one rung, no guard
    assert config_from_args(argparse.Namespace()).sched.itl_cap_s is None
    assert config_from_args(argparse.Namespace(itl_cap_ms=250.0)).sched.itl_cap_s == 0.25
    assert not config_from_args(argparse.Namespace(itl_cap_ms=250.0)).sched.itl_cap_yields
    assert config_from_args(argparse.Namespace(itl_cap_ms=250.0, itl_cap_yield=True)).sched.itl_cap_yields
    with pytest.raises(LatencyLabError, match="--itl-cap-yield needs --itl-cap-ms"):
        config_from_args(argparse.Namespace(itl_cap_yield=True))
    with pytest.raises(LatencyLabError, match="unknown ladder rung 'bf16'"):
        config_from_args(argparse.Namespace(ladder="fp32,bf16"))
    assert config_from_args(argparse.Namespace()).engine == "padded"
    assert config_from_args(argparse.Namespace(gen_engine="packed")).engine == "packed"
    with pytest.raises(LatencyLabError, match="choose from padded, packed"):
        config_from_args(argparse.Namespace(gen_engine="paged"))
    with pytest.raises(LatencyLabError, match="takes no --prefill-dtype bf16 or auto"):  # one forward, one dtype
        config_from_args(argparse.Namespace(gen_engine="packed", prefill_dtype="bf16"))
    assert config_from_args(argparse.Namespace()).sched.spec_lookup_k == 0
    assert config_from_args(argparse.Namespace(gen_engine="packed", spec_lookup=4)).sched.spec_lookup_k == 4
    for bad in (argparse.Namespace(spec_lookup=4), argparse.Namespace(gen_engine="packed", spec_lookup=0)):
        with pytest.raises(LatencyLabError, match="--spec-lookup K needs K >= 1 and --gen-engine packed"):
            config_from_args(bad)


def test_the_cache_key_is_the_whole_request_and_only_for_deterministic_answers() -> None:
    k = AnswerCache.key([5, 6], 8, 0.0, 1.0, None, ())
    assert k is not None and k == AnswerCache.key([5, 6], 8, 0.0, 1.0, None, ())
    assert k != AnswerCache.key([5, 6], 9, 0.0, 1.0, None, ())  # max_tokens
    assert k != AnswerCache.key([5, 7], 8, 0.0, 1.0, None, ())  # prompt
    assert k != AnswerCache.key([5, 6], 8, 0.0, 1.0, None, ("x",))  # stop strings
    assert AnswerCache.key([5, 6], 8, 0.7, 1.0, None, ()) is None  # sampled without a seed
    assert AnswerCache.key([5, 6], 8, 0.7, 1.0, 3, ()) is not None


def test_a_tpot_breach_steps_down_to_int8_and_probes_bring_it_back() -> None:
    svc, clock, fp32, int8, _ = make(fp32_ms=300, int8_ms=50)
    for _ in range(4):  # TPOT 300 ms against 250: usage 120 %
        s = ask(svc, clock)
        assert s.label() == {"rung": "fp32", "producer": "fp32", "cached": False, "max_tokens_cap": None,
                             "capped": False}  # fmt: skip
    clock.advance(1_000 * MS)  # past the dwell
    t = svc.evaluate_guard()
    assert t is not None and (t.from_name, t.to_name) == ("fp32", "int8") and "p99 120" in t.reason
    before = served_by(fp32)
    s = ask(svc, clock)  # within the dwell: no probe; int8 answers
    assert s.label()["rung"] == "int8" and s.headers()["X-LatencyLab-Rung"] == "int8"
    assert served_by(fp32) == before and served_by(int8) == 1 and s.text == "abcdefgh"
    assert svc.guard is not None and svc.guard.first_served(1) is None  # the switch time was already taken
    # after the dwell, 1 request in 2 also runs a shadow copy on fp32 (probe_tokens = 3): fp32 is still slow
    clock.advance(1_000 * MS)
    for _ in range(4):
        assert ask(svc, clock).label()["rung"] == "int8"
    assert served_by(fp32) == before + 2 and fp32.decodes()[-1]  # two shadows, each 3 tokens
    assert svc.evaluate_guard() is None  # the probes' p99 (120 %) is not below exit_ratio (70 %)
    # fp32 recovers: once the slow probes have left the 10-s window, probes of 20 ms a token (usage 8 %) step
    # the guard back up
    fp32.decode_base_ns = 20 * MS
    clock.advance(10_000 * MS)
    for _ in range(4):
        ask(svc, clock)
    t = svc.evaluate_guard()
    assert t is not None and (t.from_name, t.to_name) == ("int8", "fp32") and t.reason.startswith("probe p99")
    assert ask(svc, clock).label()["rung"] == "fp32"
    text = svc.metrics.exposition().decode()
    assert 'latencylab_gen_probes_total{model="gen",rung="fp32"} 4.0' in text
    assert 'latencylab_gen_ladder_transitions_total{direction="down",model="gen"} 1.0' in text


def test_hysteresis_a_rung_between_exit_and_enter_stays_put() -> None:
    svc, clock, fp32, _, _ = make(fp32_ms=300, int8_ms=50)
    for _ in range(4):
        ask(svc, clock)
    clock.advance(1_000 * MS)
    assert svc.evaluate_guard() is not None  # down to int8
    fp32.decode_base_ns = 200 * MS  # probes at 80 %: within the SLO, but not below exit_ratio's 70 %
    clock.advance(1_000 * MS)
    for _ in range(6):
        ask(svc, clock)
    assert svc.evaluate_guard() is None and svc.guard is not None and svc.guard.level == 1


def test_the_capped_rung_then_the_cache_with_the_alarm_then_recovery_on_the_timer() -> None:
    svc, clock, _, int8, alarms = make(fp32_ms=300, int8_ms=300, every_s=0.1)
    ask(svc, clock, "repeat me")  # fp32 answers, and its answer is stored for the cache rung
    for rung in ("fp32", "int8", "capped"):
        while svc.guard is not None and svc.rungs[svc.guard.level].name == rung:
            ask(svc, clock)
            clock.advance(250 * MS)
            svc.evaluate_guard()
    assert svc.guard is not None and svc.rungs[svc.guard.level].name == "cache"
    assert [a.active for a in alarms] == [True] and "now serving from cache" in alarms[0].message
    # a stored answer: no engine runs
    calls = len(int8.calls)
    hit = ask(svc, clock, "repeat me")
    assert len(int8.calls) == calls and hit.text == "abcdefgh" and hit.finish == "length"
    assert hit.label() == {"rung": "cache", "producer": "fp32", "cached": True, "max_tokens_cap": None,
                           "capped": False}  # fmt: skip
    assert hit.headers()["X-LatencyLab-Cache"] == "hit"
    # a miss: the rung above (capped int8) answers, labelled
    miss = ask(svc, clock, "never seen")
    assert miss.label() == {"rung": "capped", "producer": "capped", "cached": False, "max_tokens_cap": 4,
                            "capped": True}  # fmt: skip
    assert (
        miss.text == "abcd" and miss.finish_reason == "length" and miss.headers()["X-LatencyLab-Max-Tokens-Cap"] == "4"
    )
    assert not miss.routed  # no evidence about the cache rung
    # traffic stops: the step thread's idle loop (run_once with nothing to do) evaluates on the timer
    steps = []
    for _ in range(400):  # 40 s of 100-ms idle wake-ups
        clock.advance(100 * MS)
        assert not svc.run_once()
        steps += [t for t in svc.guard.transitions if t not in steps]
    ups = [t for t in steps if t.direction == "up"]
    assert [t.to_name for t in ups] == ["capped", "int8", "fp32"] and all(t.reason.startswith("quiet") for t in ups)
    assert svc.guard.level == 0 and [a.active for a in alarms] == [True, False]
    assert 'latencylab_gen_alarm{model="gen"} 0.0' in svc.metrics.exposition().decode()


def test_a_shed_probe_counts_against_stepping_up() -> None:
    svc, clock, _, _, _ = make(fp32_ms=300, int8_ms=50)
    for _ in range(4):
        ask(svc, clock)
    clock.advance(1_000 * MS)
    svc.evaluate_guard()
    clock.advance(1_000 * MS)
    svc.scheds["fp32"].costs.prefill_per_token_s = 1.0  # fp32 admission now predicts a TTFT far past 2 s
    for _ in range(4):
        ask(svc, clock)
    snap = svc.snapshot()["guard"]["levels"][0]
    assert snap["probe_count"] == 2 and snap["probe_quantile_ms"] == pytest.approx(100.0, rel=0.01)
    assert svc.evaluate_guard() is None


def test_one_rung_has_no_guard_and_answers_are_still_labelled() -> None:
    svc, clock, _, _, _ = make(fp32_ms=300, int8_ms=50, ladder=("fp32",))
    assert svc.guard is None and svc.cache is None and list(svc.scheds) == ["fp32"]
    assert ask(svc, clock).label()["rung"] == "fp32"

"""The prefix cache in the scheduler, on the fake model and a fake clock: a prompt that starts with the cached
prefix is prefilled from its end (fewer tokens, less time, a lower TTFT forecast); any other prompt as before."""

from __future__ import annotations

import pytest

from latencylab.clock import FakeClock
from latencylab.genserve.fake import EOS, FakeEngine
from latencylab.genserve.metrics import GenMetrics
from latencylab.genserve.prefix import chat_prefix, common_prefix
from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig

MS = 1_000_000
PREFIX = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)


def make(prefix: tuple[int, ...]) -> tuple[Scheduler, FakeEngine, FakeClock]:
    clock = FakeClock()
    eng = FakeEngine(clock, prefill_ns_per_token=MS, prefill_overhead_ns=5 * MS, reply_len=lambda s: 3, prefix=prefix)
    sched = Scheduler(eng, SchedulerConfig(max_num_seqs=4), clock)
    sched.costs.fit_prefill([(8, 0.013), (64, 0.069)])  # the fake's exact costs: 5 ms + 1 ms a token
    sched.costs.observe_decode(1, 0.022)
    return sched, eng, clock


def first_token_ms(prefix: tuple[int, ...], prompt: tuple[int, ...]) -> tuple[float, float, list[tuple[int, ...]]]:
    """(forecast TTFT, actual TTFT, prefill calls) of one request alone."""
    sched, eng, _clock = make(prefix)
    req = GenRequest(prompt, 3, eos_ids=frozenset({EOS}))
    forecast = sched.predicted_ttft_s(req) * 1e3
    seq = sched.submit(req)
    while sched.step() is not None:
        pass
    assert seq.first_token_ns is not None
    return forecast, (seq.first_token_ns - seq.arrival_ns) / MS, [c for c in eng.calls if c[0] == "prefill"]


def test_a_prompt_starting_with_the_prefix_is_prefilled_from_its_end() -> None:
    prompt = (*PREFIX, 50, 51, 52, 53, 54)
    forecast, ttft, calls = first_token_ms(PREFIX, prompt)
    assert calls == [("prefill", 1, 10, 15)]  # 5 tokens, not 15
    assert ttft == 5 + 5  # one forward's fixed cost + 5 tokens
    assert forecast == pytest.approx(ttft)  # admission counts only the tokens left
    # without the prefix cache: the whole prompt, 10 ms more
    forecast0, ttft0, calls0 = first_token_ms((), prompt)
    assert calls0 == [("prefill", 1, 0, 15)] and ttft0 == 5 + 15 and forecast0 == pytest.approx(ttft0)


def test_a_prompt_with_another_prefix_works_unchanged() -> None:
    other = (1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 50, 51)  # shares 3 tokens: the fake engine caches whole prefixes only
    assert first_token_ms(PREFIX, other)[1:] == first_token_ms((), other)[1:]
    # a prompt that is the prefix itself: its last token must run through the model (its logits give a token)
    sched, _eng, _clock = make(PREFIX)
    assert sched.cached_prefix(GenRequest(PREFIX, 3)) == 0


def test_the_skipped_prompt_tokens_are_counted() -> None:
    sched, _eng, _clock = make(PREFIX)
    metrics = GenMetrics("gen", 16384)
    hit = sched.submit(GenRequest((*PREFIX, 50, 51), 3, eos_ids=frozenset({EOS})))
    miss = sched.submit(GenRequest((70, 71, 72), 3, eos_ids=frozenset({EOS})))
    while (rep := sched.step()) is not None:
        metrics.observe_step(rep)
    assert (hit.cached_tokens, miss.cached_tokens) == (10, 0)
    text = metrics.exposition().decode()
    assert 'latencylab_gen_tokens_total{kind="prompt_cached",model="gen"} 10.0' in text
    assert 'latencylab_gen_tokens_total{kind="prompt",model="gen"} 5.0' in text  # 2 + 3 prompt tokens ran
    assert 'latencylab_gen_prefix_cache_requests_total{model="gen",result="hit"} 1.0' in text
    assert 'latencylab_gen_prefix_cache_requests_total{model="gen",result="miss"} 1.0' in text


def test_chat_prefix_is_what_two_conversations_share() -> None:
    def encode_chat(messages: list[dict[str, str]]) -> list[int]:  # a template: fixed head, the text, a fixed tail
        return [1, 2, 3, *(ord(c) for c in messages[0]["content"]), 9, 9]

    assert chat_prefix(encode_chat) == (1, 2, 3)
    assert common_prefix((1, 2, 3), (1, 2, 4, 5)) == 2 and common_prefix((), (1,)) == 0

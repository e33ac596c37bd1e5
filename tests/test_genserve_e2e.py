"""``latencylab serve --model gen`` for real (SmolLM2): the load generator drives it unchanged, answers are the
model's greedy answers, and the server's metrics see the batch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from genserve_servers import counts_of, get, post, real_server, run_load

pytestmark = pytest.mark.slow  # loads SmolLM2 and generates for real


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with real_server(ttft_slo_s=10.0) as (u, _svc):
        yield u


def test_chat_answers_like_the_model(url: str) -> None:
    status, _, body = post(
        url, "/v1/chat/completions",
        {"model": "gen", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16},
        timeout=120,
    )  # fmt: skip
    assert status == 200
    assert "Paris" in json.loads(body)["choices"][0]["message"]["content"]


def test_a_prompt_over_the_context_window_is_a_400_with_the_limit(url: str) -> None:
    status, _, body = post(url, "/v1/completions", {"prompt": "word " * 9000, "max_tokens": 4}, timeout=120)
    assert status == 400 and "context window of 8192 tokens" in json.loads(body)["error"]["message"]


def test_the_load_generator_drives_the_real_server(url: str, tmp_path: Any) -> None:
    result = run_load(url, tmp_path / "load.json", "--api", "chat", "--rate", "1", "--duration", "8",
                      "--max-tokens", "16", "--timeout", "60")  # fmt: skip
    c = counts_of(result)
    tally = {k: v for k, v in c.items() if k in ("sent", "ok", "shed", "error", "errors", "timeout", "error_kinds")}
    # every request is accounted for; on a busy machine admission may shed some (503) or the 60-s timeout end
    # one, so the judgement is the accounting and that the server answered, not that every request was ok
    assert c["sent"] >= 4 and c["sent"] == c["ok"] + c["shed"] + c["error"], tally
    assert c["ok"] >= 1, tally
    _, raw = get(url, "/metrics")
    text = raw.decode()
    ttft_count = next(line for line in text.splitlines() if line.startswith("latencylab_gen_ttft_seconds_count"))
    assert float(ttft_count.split()[-1]) >= c["ok"]  # every answered request had a first token the server saw
    shed = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("latencylab_gen_shed_total"))
    assert shed >= c["shed"]  # a 503 the generator counted is one the server counted

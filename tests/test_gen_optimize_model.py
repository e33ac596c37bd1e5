"""``optimize --workload gen`` on the real SmolLM2-135M-Instruct (slow tier), the quick search with two
candidates besides the FP32 baseline (and BF16): greedy speculative decoding with prompt lookup is exact on the
held-out prompts (agreement 1 as measured, not only by construction), dynamic INT8 is scored and timed, and
every figure of the table is there. No assertion on speed (a real clock on a shared machine)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def test_quick_gen_search_on_the_real_model() -> None:
    from latencylab.optimize.gen_lab import GenLabConfig, run_gen_lab
    from latencylab.workloads.gen_model import gguf_path

    try:
        gguf_path()
    except Exception as exc:  # the weights package is missing
        pytest.skip(str(exc))
    doc = run_gen_lab(GenLabConfig.quick(only=("int8-dynamic", "spec-lookup-k4", "bf16")))
    c = {x["name"]: x for x in doc["candidates"]}
    assert list(c) == ["fp32", "int8-dynamic", "spec-lookup-k4", "bf16"]
    b = c["bf16"]["fidelity"]  # BF16 weights: a real perplexity of their own, not the baseline's
    assert b["perplexity"] > 1 and b["perplexity"] != c["fp32"]["fidelity"]["perplexity"] and 0 <= b["top1"] <= 1
    spec = c["spec-lookup-k4"]
    assert spec["fidelity"]["token_agreement"] == 1.0 and spec["fidelity"]["exact"] == 1.0
    assert spec["status"] == "inside-budget"
    q = c["int8-dynamic"]["fidelity"]
    assert 0 <= q["token_agreement"] <= 1 and 0 <= q["top1"] <= 1 and q["perplexity"] > 1
    for x in c.values():
        assert x["n"] == 1 and x["tpot_ms"] > 0 and x["ttft_p50_ms"] > 0  # 1 round x 1 timing prompt
    assert doc["summary"]["speedups"]["fp32"]["tpot"] == 1.0
    assert doc["summary"]["verdict"]

"""compare on generative load results: TTFT/TPOT/ITL/E2E series and gates (ttft_p99>+10%, itl:p99>...)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gen_synthetic import synthetic_gen_result
from latencylab.compare.core import compare_docs
from latencylab.compare.model import Gate
from latencylab.errors import LatencyLabError


def test_token_gate_aliases_parse() -> None:
    g = Gate.parse("ttft_p99>+10%")
    assert (g.series, g.metric, g.threshold, g.relative) == ("ttft", "p99", pytest.approx(0.1), True)
    assert (Gate.parse("tpot_p99.9>5ms").series, Gate.parse("tpot_p99.9>5ms").metric) == ("tpot", "p999")
    assert Gate.parse("itl:p99>2ms").series == "itl"
    with pytest.raises(LatencyLabError, match="unknown metric"):
        Gate.parse("ttft_p42x>1%")


def _docs():  # type: ignore[no-untyped-def]
    # 1,200 requests a side: a p99 needs 10 samples beyond it before compare trusts it
    a = synthetic_gen_result(rate=60, ttft_ms=100, gap_ms=20, seed=1).to_dict()
    b = synthetic_gen_result(rate=60, ttft_ms=150, gap_ms=20, seed=2).to_dict()  # TTFT +50%, decode unchanged
    return json.loads(json.dumps(a)), json.loads(json.dumps(b))


def test_token_series_and_gates() -> None:
    a, b = _docs()
    gates = [Gate.parse(g) for g in ("ttft_p99>+10%", "tpot_p99>+10%", "itl_p99>+10%", "e2e:p50>+1%")]
    c = compare_docs(a, b, gates, strict=True)
    names = [s.name for s in c.series]
    assert {"latency", "ttft", "tpot", "itl", "e2e"} <= set(names)
    ttft = next(s for s in c.series if s.name == "ttft").metric("p50")
    assert ttft.baseline / 1e6 == pytest.approx(100, rel=0.05) and ttft.candidate / 1e6 == pytest.approx(150, rel=0.05)
    fired = {g.gate.text: g.fired for g in c.gates}
    assert fired == {"ttft_p99>+10%": True, "tpot_p99>+10%": False, "itl_p99>+10%": False, "e2e:p50>+1%": True}
    assert [g.series for g in c.gates] == ["ttft", "tpot", "itl", "e2e"]


def test_cli_fails_on_a_token_gate(tmp_path: Path) -> None:
    a, b = _docs()
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    run = lambda *g: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "latencylab", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
         "--strict", *[x for gate in g for x in ("--fail-if", gate)]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    p = run("ttft_p99>+10%")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "ttft" in p.stdout and "itl" in p.stdout
    p = run("itl_p99>+10%", "tpot_p99>+10%")
    assert p.returncode == 0, p.stdout + p.stderr

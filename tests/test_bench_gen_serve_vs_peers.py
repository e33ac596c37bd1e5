"""benchmarks/gen_serve_vs_peers.py: the capacity search and the report's verdicts (fast, on made-up steps), and
one ``--quick`` run against the real servers (slow: checks the accounting and the table, not the speed)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gen_serve_vs_peers as gsp  # noqa: E402


def step(server: str, rate: float, passed: bool, purpose: str = "search", **kw: object) -> gsp.Step:
    base = dict(
        server=server, purpose=purpose, rate=rate, seed=gsp.seed_for(rate), duration_s=60.0, wall_s=60.0,
        sent=10, ok=10, shed=0, error=0, good=10 if passed else 8, passed=passed, ttft_p50_ms=100.0,
        ttft_p99_ms=500.0, tpot_p50_ms=50.0, tpot_p99_ms=80.0, output_tokens=300, output_tokens_per_s=5.0,
        server_cpu_s=60.0, generator_valid=True, late_fraction=0.0,
    )  # fmt: skip
    base.update(kw)
    return gsp.Step(**base)  # type: ignore[arg-type]


def cfg(**kw: object) -> gsp.Config:
    base = dict(ttft_slo_s=4.0, tpot_slo_s=0.25, max_tokens=48, min_duration_s=60.0, max_duration_s=120.0,
                min_requests=16, max_steps=6, timeout_s=60.0, pin=True, quick=False)  # fmt: skip
    base.update(kw)
    return gsp.Config(**base)  # type: ignore[arg-type]


def test_search_brackets_then_bisects_to_the_precision() -> None:
    ceiling = 0.4
    seen: list[float] = []

    def run(rate: float) -> gsp.Step:
        seen.append(rate)
        return step("x", rate, rate <= ceiling)

    steps = gsp.search(run, 0.1, max_steps=10)
    assert seen[:5] == [0.1, 0.15, 0.225, 0.338, 0.507]  # x1.5 until the first failure
    assert not steps[4].passed and all(s.passed for s in steps[:4])
    assert seen[5] == round(math.sqrt(0.338 * 0.507), 3)  # then the geometric midpoint
    cap = gsp.capacity(steps)
    assert cap is not None and cap <= ceiling
    fails = [s.rate for s in steps if not s.passed]
    assert min(fails) / cap <= 1.2  # stopped once pass and fail are within the precision


def test_search_steps_down_when_the_start_fails_and_capacity_ignores_a_lucky_pass_above_a_failure() -> None:
    steps = gsp.search(lambda r: step("x", r, r <= 0.05), 0.1, max_steps=3)
    assert [s.rate for s in steps][:2] == [0.1, 0.067]
    lucky = [step("x", 0.2, True), step("x", 0.3, False), step("x", 0.25, True), step("x", 0.45, True)]
    assert gsp.capacity(lucky) == 0.25
    assert gsp.capacity([step("x", 0.2, False)]) is None


def test_duration_covers_the_minimum_requests_within_bounds() -> None:
    c = cfg()
    assert gsp.duration_for(c, 1.0) == 60.0
    assert gsp.duration_for(c, 0.2) == 80.0
    assert gsp.duration_for(c, 0.05) == 120.0


def test_report_states_ratios_and_targets_from_the_steps() -> None:
    def doc(name: str, steps: list[gsp.Step]) -> dict[str, object]:
        return {"server": name, "capacity": gsp.capacity(steps), "steps": [asdict(s) for s in steps]}

    docs = {
        "naive": doc("naive", [step("naive", 0.1, True), step("naive", 0.15, False),
                               step("naive", 0.07, True, "at-70%-naive", ttft_p99_ms=3000.0)]),
        "static": doc("static", [step("static", 0.2, True), step("static", 0.3, False)]),
        "latencylab": doc("latencylab", [
            step("latencylab", 0.45, True), step("latencylab", 0.6, False),
            step("latencylab", 0.07, True, "at-70%-naive", ttft_p99_ms=900.0),
            step("latencylab", 0.9, False, "overload-2x", sent=40, ok=25, shed=14, error=1, ttft_p99_ms=3900.0),
        ]),
        "llamacpp": {"server": "llamacpp", "skipped": "not built: bash benchmarks/peers/llamacpp_setup.sh"},
    }  # fmt: skip
    text = gsp.report(docs, cfg())  # type: ignore[arg-type]
    assert "latencylab / naive capacity: 4.50x (target >= 4x: met)" in text
    assert "latencylab / static capacity: 2.25x (target >= 1.5x: met)" in text
    assert "TTFT p99 latencylab 900 ms vs naive 3000 ms: 70% lower (target >= 60%: met)" in text
    assert "sent 40 = ok 25 + shed 14 + error 1 (holds)" in text and "<= the 4-s SLO: met" in text
    assert "| llamacpp | skipped: not built" in text
    assert "| naive | 0.100 |" in text and "| latencylab | 0.450 |" in text
    docs["latencylab"]["capacity"] = 0.3  # type: ignore[index]
    assert "latencylab / naive capacity: 3.00x (target >= 4x: NOT met)" in gsp.report(docs, cfg())  # type: ignore[arg-type]
    assert "latencylab-packed" not in text  # a variant is reported only where it was measured
    docs["latencylab-packed"] = doc("latencylab-packed", [
        step("latencylab-packed", 0.6, True), step("latencylab-packed", 0.8, False),
        step("latencylab-packed", 0.07, True, "at-70%-naive", ttft_p99_ms=600.0),
    ])  # fmt: skip
    text = gsp.report(docs, cfg())  # type: ignore[arg-type]
    assert "latencylab-packed / naive capacity: 6.00x (target >= 4x: met)" in text
    assert "TTFT p99 latencylab-packed 600 ms vs naive 3000 ms: 80% lower" in text
    assert "overload 2x latencylab-packed: not measured" in text and "| latencylab-packed | 0.600 |" in text


@pytest.mark.slow
def test_quick_run_accounts_for_every_request_and_writes_the_table(tmp_path: Path) -> None:
    env = {**os.environ, "LATENCYLAB_CACHE": os.environ.get("LATENCYLAB_CACHE", str(ROOT / ".cache" / "latencylab"))}
    out = tmp_path / "gen"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gen_serve_vs_peers.py"), "--quick", "--only",
         "naive,static,latencylab", "--out", str(out)],
        capture_output=True, text=True, timeout=540, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    purposes: set[str] = set()
    for name in ("naive", "static", "latencylab"):
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["steps"], name
        for s in doc["steps"]:
            assert s["sent"] == s["ok"] + s["shed"] + s["error"], s
            assert s["good"] <= s["ok"]
            purposes.add(s["purpose"])
        assert doc["capacity"] == gsp.capacity([gsp.Step(**s) for s in doc["steps"]])
    assert "search" in purposes
    report = (out / "report.md").read_text()
    for name in ("naive", "static", "latencylab"):
        assert f"| {name} |" in report
    assert "latencylab / naive" in report and "latencylab / static" in report
    assert (out / "gen-serve-vs-peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

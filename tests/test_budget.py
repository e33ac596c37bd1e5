"""Latency budgets: parsing (deadline or physical), the verdict against known samples, the CLI exit code."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from latencylab.budget import Budget, evaluate_budget, load_budget, parse_budget, render_budget_verdict
from latencylab.errors import LatencyLabError
from latencylab.results import ProfileResult, StageSeries

ROOT = Path(__file__).resolve().parents[1]


def _result(stages: dict[str, list[int]]) -> ProfileResult:
    n = len(next(iter(stages.values())))
    return ProfileResult(
        workload="hand",
        stages=tuple(StageSeries(k, "compute", tuple(v)) for k, v in stages.items()),
        iteration_start_ns=tuple(range(0, n * 1000, 1000)),
        clock="fake",
        config={},
        pipeline={},
        env={},
        stop_reason="iterations",
        warmup_iterations=0,
        wall_time_s=1.0,
    )


MS = 1_000_000
# 101 iterations: the type-7 p99 of 0..100 (x unit) is exactly 99 units; p50 is 50.
HAND = _result({"decode": [i * MS // 100 for i in range(101)], "forward": [2 * i * MS // 100 for i in range(101)]})


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "b.toml"
    p.write_text(text)
    return p


def test_physical_deadline_is_distance_over_speed_minus_reserve(tmp_path: Path) -> None:
    b = load_budget(_write(tmp_path, "[physical]\nspeed_m_s = 30\ndistance_m = 3\n"))
    assert b.deadline_ms == pytest.approx(100.0) and b.quantile == 0.99 and b.stages is None
    assert b.origin == "3 m / 30 m/s = 100 ms" and b.name == "b"
    b = parse_budget({"physical": {"speed_m_s": 2.0, "distance_m": 0.01, "reserve_ms": 1.5}, "quantile": "p99.9"})
    assert b.deadline_ms == pytest.approx(3.5) and b.quantile == pytest.approx(0.999)


def test_the_example_budget_file_parses() -> None:
    b = load_budget(ROOT / "examples" / "budget-vision.toml")
    assert b.deadline_ms == pytest.approx(3.5)
    assert b.stages is not None and set(b.stages) == {"decode", "preprocess", "forward", "postprocess"}
    assert b.allocated_ms <= b.deadline_ms


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("deadline_ms = 5\n[physical]\nspeed_m_s = 1\ndistance_m = 1\n", "exactly one of deadline_ms"),
        ("quantile = 0.99\n", "exactly one of deadline_ms"),
        ("deadline_ms = 5\nquantile = 99\n", "not a fraction"),
        ("deadline_ms = 5\nquantile = 'q99'\n", "p99 or p99.9"),
        ("deadline_ms = -1\n", "positive number of ms"),
        ("deadline_ms = '5ms'\n", "must be a number"),
        ("deadline_ms = 5\n[stages]\nforward = 0\n", "allowance of stage 'forward'"),
        ("deadline_ms = 5\nbogus = 1\n", "unknown key"),
        ("[physical]\nspeed_m_s = 10\n", "needs speed_m_s and distance_m"),
        ("[physical]\nspeed_m_s = 10\ndistance_m = 0.01\nreserve_ms = 2\n", "leaves no time"),
        ("deadline_ms = [", "not valid TOML"),
    ],
)
def test_bad_budget_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(LatencyLabError, match=message) as exc:
        load_budget(_write(tmp_path, text))
    assert "\n" not in str(exc.value)


def test_missing_budget_file(tmp_path: Path) -> None:
    with pytest.raises(LatencyLabError, match="no such budget file"):
        load_budget(tmp_path / "nope.toml")


def test_verdict_against_hand_computed_quantiles() -> None:
    # decode p99 = 0.99 ms, forward p99 = 1.98 ms, end-to-end (3 x decode) p99 = 2.97 ms.
    b = Budget(deadline_ms=3.0, stages={"decode": 0.5, "forward": 1.8})
    v = evaluate_budget(b, HAND)
    assert v.end_to_end.measured_ms == pytest.approx(2.97)
    assert v.end_to_end.ok and v.end_to_end.over_by_ms == pytest.approx(-0.03)
    dec, fwd = v.row("decode"), v.row("forward")
    assert dec.measured_ms == pytest.approx(0.99) and dec.over_by_ms == pytest.approx(0.49)
    assert fwd.measured_ms == pytest.approx(1.98) and fwd.over_by_ms == pytest.approx(0.18)
    assert dec.share == pytest.approx(1 / 3) and fwd.share == pytest.approx(2 / 3)
    # decode is 1.98x its allowance, forward 1.1x: decode breaks first although forward is the bigger stage
    assert not v.ok and v.over_stages == ("decode", "forward") and v.breaking_stage == "decode"
    assert v.headline().startswith(
        "BUDGET BROKEN: p99 end-to-end 2.97 ms vs deadline 3 ms: within; breaks first: decode"
    )
    d = v.to_dict()
    assert d["ok"] is False and d["breaking_stage"] == "decode" and d["stages"][0]["ratio"] == pytest.approx(1.98)


def test_verdict_end_to_end_only_and_p50() -> None:
    v = evaluate_budget(Budget(deadline_ms=1.4, quantile=0.5), HAND)  # p50 end-to-end = 1.5 ms
    assert v.end_to_end.measured_ms == pytest.approx(1.5) and not v.ok and v.breaking_stage is None
    assert all(r.ok is None and r.allowance_ms is None for r in v.stages)
    assert evaluate_budget(Budget(deadline_ms=1.5, quantile=0.5), HAND).ok


def test_verdict_met_and_warnings() -> None:
    v = evaluate_budget(Budget(deadline_ms=2.0, stages={"decode": 1.0, "forward": 2.0}), HAND)
    # stages within, end-to-end over: the allowances (3 ms) exceed the deadline (2 ms), which is warned about
    assert v.row("decode").ok and v.row("forward").ok and not v.end_to_end.ok and not v.ok
    assert v.breaking_stage is None
    assert any("add up to 3 ms" in w for w in v.warnings)
    assert any("rests on 1 tail samples of 101" in w for w in v.warnings)


def test_unknown_stage_in_budget() -> None:
    with pytest.raises(LatencyLabError, match=r"stage\(s\) \['nope'\].*its stages: decode, forward"):
        evaluate_budget(Budget(deadline_ms=3.0, stages={"nope": 1.0}), HAND)


def test_render_marks_the_stage_that_breaks_first() -> None:
    buf = io.StringIO()
    v = evaluate_budget(Budget(deadline_ms=3.0, stages={"decode": 0.5, "forward": 1.8}, name="demo"), HAND)
    render_budget_verdict(v, Console(file=buf, width=160, no_color=True))
    text = buf.getvalue()
    assert "latency budget demo: p99 <= 3 ms end-to-end" in text
    line = next(ln for ln in text.splitlines() if "decode" in ln and "OVER" in ln)
    assert "breaks first" in line and "+0.490" in line and "1.98" in line
    assert "BUDGET BROKEN" in text


def _profile(tmp_path: Path, budget: str) -> subprocess.CompletedProcess[str]:
    b = _write(tmp_path, budget)
    return subprocess.run(
        [sys.executable, "-m", "latencylab", "profile", "--workload", "synthetic", "--iterations", "200",
         "--warmup", "2", "--quiet", "--param", "stages=pre:constant(200us);fwd:constant(1ms)",
         "--latency-budget", str(b)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_profile_exit_code_follows_the_budget(tmp_path: Path) -> None:
    # A real (busy-waiting) profile: fwd takes >= 1 ms, pre >= 0.2 ms, so 0.5 ms for fwd is broken ...
    p = _profile(tmp_path, "deadline_ms = 50\n[stages]\npre = 20\nfwd = 0.5\n")
    assert p.returncode == 1, p.stderr
    assert "BUDGET BROKEN" in p.stdout and "breaks first: fwd" in p.stdout
    # ... and a generous budget is met (exit 0).
    p = _profile(tmp_path, "[physical]\nspeed_m_s = 10\ndistance_m = 1\n[stages]\npre = 40\nfwd = 40\n")
    assert p.returncode == 0, p.stderr + p.stdout
    assert "BUDGET MET" in p.stdout and "1 m / 10 m/s = 100 ms" in p.stdout
    p = _profile(tmp_path, "deadline_ms = 'x'\n")
    assert p.returncode == 2 and p.stderr.strip().endswith("deadline_ms must be a number, got 'x'")

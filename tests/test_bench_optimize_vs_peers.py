"""benchmarks/optimize_vs_peers.py's ratios, targets and table, on a synthetic result (no model is run)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import optimize_vs_peers as ovp

BUDGET = ovp.BUDGETS["text"]
IN = {"cos_mean": 0.995, "cos_min": 0.985, "n": 64}  # inside cos>=0.99,min_cos>=0.98
OUT = {"cos_mean": 0.95, "cos_min": 0.90, "n": 64}  # outside
EXACT = {"cos_mean": 1.0, "cos_min": 1.0, "n": 64}


def cand(name: str, sentences: tuple[float, dict[str, Any]], passages: tuple[float, dict[str, Any]]) -> dict[str, Any]:
    def m(p50: float, fid: dict[str, Any]) -> dict[str, Any]:
        return {"p50_ms": p50, "p99_ms": 2 * p50, "fidelity": fid, "tokens_per_call": 128.0}

    return {
        "name": name,
        "status": "inside-budget",
        "input_policy": "as-given",
        "stats": {"seq_lens": [10, 17, 30]},
        "sets": {"sentences": m(*sentences), "passages128": m(*passages)},
    }


def run(chosen: str = "ort-int8-x", choice: tuple[float, float] = (4.0, 9.0)) -> dict[str, Any]:
    rows = {
        "torch-fp32": cand("torch-fp32", (16.0, EXACT), (30.0, EXACT)),
        "ort-fp32": cand("ort-fp32", (8.0, EXACT), (20.0, EXACT)),
        "torch-bf16": cand("torch-bf16", (12.0, IN), (25.0, IN)),
        "torch-int8-dynamic": cand("torch-int8-dynamic", (5.0, OUT), (9.0, OUT)),  # faster, but fails
        "ort-int8-dynamic-default": cand("ort-int8-dynamic-default", (6.0, OUT), (10.0, IN)),
    }
    if chosen not in rows:
        rows[chosen] = cand(chosen, (choice[0], IN), (choice[1], IN))
    return {"threads": 1, "search_s": 420.0, "chosen": chosen, "rows": rows, "load_search": 1.5, "load_compare": 1.6}


def test_ratios_are_against_eager_and_the_fastest_peer_inside_the_budget_on_each_set() -> None:
    r = run()
    s = ovp.analyse_set(BUDGET, r, "sentences")
    assert s["vs_eager"] == pytest.approx(16.0 / 4.0)  # 4.00x >= 3x
    assert s["met_vs_eager"] is True
    # torch-int8-dynamic (5 ms) and ORT defaults (6 ms) fail the budget on sentences: the best peer is ort-fp32
    assert s["best_peer"] == "ort-fp32"
    assert s["vs_peer"] == pytest.approx(8.0 / 4.0)
    assert s["ok"] is True
    p = ovp.analyse_set(BUDGET, r, "passages128")
    assert p["vs_eager"] == pytest.approx(30.0 / 9.0)
    assert p["target_vs_eager"] == 2.5
    # on passages the ORT defaults meet the budget (10 ms): 10 / 9 = 1.11x < 1.5x
    assert p["best_peer"] == "ort-int8-dynamic-default"
    assert p["vs_peer"] == pytest.approx(10.0 / 9.0)
    assert (p["met_vs_eager"], p["met_vs_peer"], p["ok"]) == (True, False, False)


def test_report_says_which_target_failed_and_exits_nonzero() -> None:
    out = io.StringIO()
    assert ovp.report("text", [run()], out) is False
    text = out.getvalue()
    assert "choice vs eager (torch-fp32): 4.00x (target >= 3x: met)" in text
    assert "choice vs best in-budget peer (ort-int8-dynamic-default, 10.00 ms): 1.11x (target >= 1.5x: NOT met)" in text
    assert "every target met: NO" in text
    # rows eager / peers / choice with their budget verdict on that set
    assert "torch-int8-dynamic (peer: torch dynamic INT8 (torch.ao))" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("ort-int8-x (latencylab)"))
    assert line.split()[-1] == "meets" and "4.00" in line


def test_every_target_met_returns_true() -> None:
    out = io.StringIO()
    assert ovp.report("text", [run(choice=(4.0, 6.0))], out) is True  # 30/6 = 5x, 10/6 = 1.67x
    assert "every target met: yes" in out.getvalue()


def test_below_the_eager_target_is_not_met() -> None:
    a = ovp.analyse_set(BUDGET, run(choice=(6.0, 6.0)), "sentences")  # 16/6 = 2.67x < 3x
    assert a["met_vs_eager"] is False and a["ok"] is False


def test_a_choice_that_is_a_peer_is_compared_with_itself() -> None:
    """latencylab choosing ort-fp32 gains nothing over the peer that ships it: 1.00x, not met."""
    a = ovp.analyse_set(BUDGET, run(chosen="ort-fp32"), "sentences")
    assert a["best_peer"] == "ort-fp32" and a["vs_peer"] == pytest.approx(1.0) and a["met_vs_peer"] is False
    assert next(r for r in a["rows"] if r["name"] == "ort-fp32")["role"] == "latencylab = peer"


def test_no_choice_fails_every_target() -> None:
    r = run()
    r["chosen"] = None
    assert ovp.analyse_set(BUDGET, r, "sentences")["ok"] is False
    assert ovp.report("text", [r], io.StringIO()) is False


def test_an_exact_choice_is_compared_with_eager_on_the_same_inputs() -> None:
    r = run(chosen="ort-x-exact", choice=(2.0, 9.0))
    r["rows"]["ort-x-exact"]["input_policy"] = "exact"
    r["rows"]["torch-fp32-exact"] = cand("torch-fp32-exact", (8.0, EXACT), (30.0, EXACT))
    a = ovp.analyse_set(BUDGET, r, "sentences")
    assert a["eager_reference"] == "torch-fp32-exact" and a["vs_eager"] == pytest.approx(4.0)  # not 16 / 2


def test_roofline_fraction_above_the_roof_is_a_measurement_error_not_a_figure() -> None:
    entry = {"dtype": "int8", "tokens": 128, "gflop": 2.87, "achieved_gflops": 500.0, "attainable_gflops": 400.0,
             "bound": "compute", "fraction": 1.25, "valid": False}  # fmt: skip
    text = ovp.roofline_text(entry)
    assert text.startswith("roofline: measurement error") and "125%" not in text and "1.25x above the roof" in text
    ok = dict(entry, achieved_gflops=200.0, fraction=0.5, valid=True)
    assert ovp.roofline_text(ok).startswith("roofline: 50% of the attainable rate: 200.0 GOP/s")
    assert ovp.roofline_text(None) == "roofline: not placed"
    assert "KeyError" in ovp.roofline_text({"error": "KeyError: x"})


def test_report_prints_the_choice_roofline_beside_its_speedup() -> None:
    r = run(choice=(4.0, 6.0))
    r["roofline"] = {"sentences": {"ort-int8-x": {"dtype": "int8", "tokens": 17, "gflop": 0.4, "achieved_gflops": 100.0,
                                                  "attainable_gflops": 400.0, "bound": "compute", "fraction": 0.25,
                                                  "valid": True}}}  # fmt: skip
    out = io.StringIO()
    ovp.report("text", [r], out)
    line = next(ln for ln in out.getvalue().splitlines() if "choice vs eager" in ln)
    assert "4.00x" in line and "roofline: 25% of the attainable rate" in line


def test_a_comparison_visit_covers_every_input_set_a_whole_number_of_times() -> None:
    """64 sentences and 16 passages: 64 calls per visit start every variant at the same feed (the search's
    10 per visit gave each variant a different slice of the sentences: not equal work)."""
    assert ovp.whole_cycle([64, 16]) == 64
    assert ovp.whole_cycle([360]) is None  # vision's 360 images: over the cap, the script keeps its default
    assert ovp.whole_cycle([6, 4]) == 12

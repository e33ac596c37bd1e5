"""benchmarks/serve_vs_peers.py's verdict and options (the script itself runs servers; these parts do not)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_vs_peers as svp


def test_capacity_ratio_has_no_verdict_when_no_server_passed() -> None:
    assert svp.capacity_ratio(36.0, 30.0) == (pytest.approx(1.2), False)
    assert svp.capacity_ratio(30.0, 0.0) == (math.inf, True)  # only latencylab passed, the peer's range unknown
    assert svp.capacity_ratio(0.0, 0.0) == (None, False)  # it was "inf, MET" before: 0 / 0 must not meet a target


def test_a_peer_below_the_grid_gives_a_lower_bound_not_an_infinite_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """latencylab passes 33/s and the peer fails the grid's lowest rate, 33/s: the peer's capacity is below 33,
    so the ratio is only known to exceed 33 / 33 = 1.00x. That is not a met 1.3x target (it printed "infx MET").
    With latencylab at 42/s on a grid from 30/s, the bound 1.40x does meet it."""
    args = svp.parse_args(["--only", "latencylab,naive", "--grid", "33,39", "--pooled", "4"])

    def result(name: str, cap: float, rates: list[float]) -> dict[str, object]:
        steps = [{"offered_rate": r} for r in rates]
        return {"server": name, "capacity": cap, "rep": None, "at_capacity": None, "steps": steps}

    out = svp.report([result("latencylab", 33.0, [33.0, 39.0]), result("naive", 0.0, [33.0])], args, {}, {})
    text = capsys.readouterr().out
    assert out["verdict"]["ratio"] == pytest.approx(1.0) and out["verdict"]["ratio_is_lower_bound"]
    assert not out["verdict"]["met"]
    assert "> 1.00x (naive failed its lowest rate, 33/s) (target >= 1.3x): NOT MET" in text
    out = svp.report([result("latencylab", 42.0, [30.0, 36.0, 42.0]), result("naive", 0.0, [30.0])], args, {}, {})
    assert out["verdict"]["met"] and "> 1.40x" in capsys.readouterr().out


def test_also_serves_more_latencylab_configurations_by_label() -> None:
    args = svp.parse_args(["--only", "latencylab,naive", "--also", "spin3:ort_spin_us=3000,max_batch_size=4"])
    assert args.servers == ["latencylab", "naive", "latencylab:spin3"]
    assert args.also == {"spin3": ["ort_spin_us=3000", "max_batch_size=4"]}
    assert svp.spec_of("latencylab:spin3") is svp.SPECS["latencylab"]
    for bad in ("spin3", "spin3:", "spin3:ort_spin_us", "3x:a=1"):
        with pytest.raises(SystemExit):
            svp.parse_args(["--also", bad])


def test_the_report_states_the_interpolated_crossing_of_pooled_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """A pooled run's result carries each server's SLO crossing; the report prints both and their ratio beside
    the grid verdict (40 / 32 = 1.25x while the grid's own capacities say 36 / 30 = 1.20x)."""
    args = svp.parse_args(["--only", "latencylab,naive", "--grid", "30,36,42", "--pooled", "4"])

    def result(name: str, cap: float, crossing: float) -> dict[str, object]:
        return {"server": name, "capacity": cap, "rep": None, "at_capacity": None, "steps": [], "crossing": crossing}

    out = svp.report([result("latencylab", 36.0, 40.0), result("naive", 30.0, 32.0)], args, {}, {})
    text = capsys.readouterr().out
    assert out["verdict"]["ratio"] == pytest.approx(1.2) and not out["verdict"]["met"]
    assert out["verdict"]["crossing_ratio"] == pytest.approx(1.25)
    assert "interpolated SLO crossing: latencylab 40.0/s, naive 32.0/s, ratio 1.25x" in text

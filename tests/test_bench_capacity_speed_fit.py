"""benchmarks/capacity_speed_fit.py: a shed curve that moves with the host's speed crosses at one load in the
server's work units (rate x preprocess seconds), while its req/s crossing moves with the speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import capacity_speed_fit as csf

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "capacity_speed_fit.py"


def doc(pre_ms: float, rates: list[float]) -> dict[str, object]:
    """A text run whose shed fraction is 5% at a load of 0.07 CPU-s/s of preprocess, rising 1 point per 0.001."""
    steps = [
        {"phase": "refine", "offered_rate": r, "sent": 1000, "server_preprocess_ms": pre_ms,
         "failed_fraction": 0.05 + 10.0 * (r * pre_ms / 1e3 - 0.07)}
        for r in rates
    ]  # fmt: skip
    return {"model": "text", "runs": [{"capacity": {"capacity_rate": 0.07 / (pre_ms / 1e3), "steps": steps}}]}


def test_the_line_crosses_the_allowance_where_the_fractions_do() -> None:
    x = np.array([30.0, 35.0, 40.0, 45.0])
    assert csf.fit_crossing(x, 0.01 * (x - 30.0), np.ones(4), 0.05) == pytest.approx(35.0)
    assert np.isnan(csf.fit_crossing(x, 0.05 - 0.001 * x, np.ones(4), 0.05))  # falling: no crossing
    assert csf.spread([38.6, 38.6, 44.1]) == pytest.approx(5.5 / 38.6)


def test_runs_on_a_faster_host_agree_in_work_units_not_in_requests(tmp_path: Path) -> None:
    slow, fast = tmp_path / "text-slow.json", tmp_path / "text-fast.json"
    slow.write_text(json.dumps(doc(2.0, [31.0, 33.0, 35.0, 37.0, 39.0])))  # crosses at 35/s
    fast.write_text(json.dumps(doc(1.6, [39.0, 41.0, 43.0, 45.0, 47.0])))  # crosses at 43.75/s
    out = subprocess.run([sys.executable, str(SCRIPT), str(slow), str(fast)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("text-")}
    assert float(rows["text-slow.json"][1]) == pytest.approx(35.0, abs=0.05)
    assert float(rows["text-fast.json"][1]) == pytest.approx(43.75, abs=0.05)
    assert float(rows["text-slow.json"][2]) == pytest.approx(0.07) == float(rows["text-fast.json"][2])
    assert "spread of linear: +/-11.1%" in out and "spread of work (= at ref): +/-0.0%" in out

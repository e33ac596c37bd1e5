"""benchmarks/serve_vs_peers.py's verdict and options (the script itself runs servers; these parts do not)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_vs_peers as svp


def test_capacity_ratio_has_no_verdict_when_no_server_passed() -> None:
    assert svp.capacity_ratio(36.0, 30.0) == pytest.approx(1.2)
    assert svp.capacity_ratio(30.0, 0.0) == math.inf  # only latencylab passed a step
    assert svp.capacity_ratio(0.0, 0.0) is None  # it was "inf, MET" before: 0 / 0 must not meet a target


def test_also_serves_more_latencylab_configurations_by_label() -> None:
    args = svp.parse_args(["--only", "latencylab,naive", "--also", "spin3:ort_spin_us=3000,max_batch_size=4"])
    assert args.servers == ["latencylab", "naive", "latencylab:spin3"]
    assert args.also == {"spin3": ["ort_spin_us=3000", "max_batch_size=4"]}
    assert svp.spec_of("latencylab:spin3") is svp.SPECS["latencylab"]
    for bad in ("spin3", "spin3:", "spin3:ort_spin_us", "3x:a=1"):
        with pytest.raises(SystemExit):
            svp.parse_args(["--also", bad])

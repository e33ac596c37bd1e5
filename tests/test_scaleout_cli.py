"""``latencylab load --ray [ADDRESS] --workers N`` and ``serve --ray --replicas N``: the flags, their errors,
and no ray import without them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from latencylab.cli import build_parser
from latencylab.errors import LatencyLabError
from latencylab.scaleout.cli import cluster_from


def test_flags_parse_and_workers_need_ray() -> None:
    p = build_parser()
    a = p.parse_args(["load", "--url", "http://127.0.0.1:1", "--model", "m", "--ray", "--workers", "3"])
    assert a.ray == "" and a.workers == 3
    a = p.parse_args(["load", "--url", "http://127.0.0.1:1", "--model", "m", "--ray", "10.0.0.1:6379"])
    assert a.ray == "10.0.0.1:6379" and a.workers is None
    with pytest.raises(LatencyLabError, match="--workers needs --ray"):
        cluster_from(None, 2)
    assert cluster_from(None, None) is None
    lc = cluster_from("", None)
    assert lc.n == 2 and lc.address is None  # default 2 workers, local Ray / RAY_ADDRESS


def test_cli_refuses_workers_without_ray_in_one_line_and_never_imports_ray() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", "--url", "http://127.0.0.1:9", "--model", "m", "--workers", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0 and "--workers needs --ray" in out.stderr and "Traceback" not in out.stderr
    code = "import sys, latencylab.cli, latencylab.load.frontend; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_serve_ray_flags_and_their_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from latencylab.cli import main

    a = build_parser().parse_args(["serve", "--model", "vision", "--ray", "--replicas", "3"])
    assert a.ray == "" and a.replicas == 3
    for argv, why in (
        (["serve", "--model", "vision", "--replicas", "2"], "--replicas needs --ray"),
        (["serve", "--model", "gen", "--ray", "--autoscale", "1:2"], "not --model gen"),
        (["serve", "--model", "vision", "--ray", "--port", "0"], "--port 0 is not supported with --ray"),
        (["serve", "--model", "vision", "--ray", "--timeline", "t.json"], "--timeline is per process"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err

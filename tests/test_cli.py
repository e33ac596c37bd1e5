"""The CLI end to end, in a subprocess like a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from latencylab.results import load_result


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "latencylab", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_profile_synthetic_prints_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = run(
        "profile",
        "--workload",
        "synthetic",
        "--iterations",
        "300",
        "--warmup",
        "5",
        "--param",
        "stages=preprocess:constant(300us);forward:normal(1ms,50us)",
        "--param",
        "spike=forward@150+40x3",
        "--param",
        "timer=fake",  # the stages advance a FakeClock the profiler reads: exact shares on a busy machine
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("latencylab profile: synthetic (300 iterations, clock fake)"), lines[0]
    table = "\n".join(lines)
    for name in ("preprocess", "forward", "end-to-end", "share", "p99.9"):
        assert name in table
    assert "stopped: iterations reached" in p.stdout
    jump = re.search(r"latency jumped x[\d.]+ over iterations (\d+)-", p.stdout)
    assert jump and 145 <= int(jump.group(1)) <= 155, p.stdout  # the injected spike (at 150), located
    res = load_result(out)
    assert res.n == 300 and res.stage_names == ("preprocess", "forward")
    d = json.loads(out.read_text())
    assert d["config"]["iterations"] == 300 and d["config"]["rule"] == "iterations"
    # 300 x 0.3 ms of preprocess against 260 x 1 ms + 40 x 3 ms of forward
    assert d["summary"]["stages"]["preprocess"]["share"] == pytest.approx(90 / 470, rel=0.05)
    spikes = d["summary"]["spikes"]
    assert spikes and abs(spikes[0]["start"] - 150) <= 3


def test_env_json_and_diff(tmp_path: Path) -> None:
    p = run("env", "--json")
    assert p.returncode == 0, p.stderr
    fp = json.loads(p.stdout)
    assert fp["cpu"]["logical_cpus"] >= 1
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(fp))
    fp["libraries"]["torch"] = "9.9.9"
    b.write_text(json.dumps({"schema_version": 1, "kind": "profile", "env": fp}))
    d = run("env", "--diff", str(a), str(b))
    assert d.returncode == 0, d.stderr
    assert "libraries.torch" in d.stdout and "9.9.9" in d.stdout
    same = run("env", "--diff", str(a), str(a))
    assert "no differences that affect latency" in same.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["profile", "--iterations", "0"],
            "latencylab profile: error: argument --iterations: 0 must be >= 1",
        ),
        (
            ["profile", "--iterations", "ten"],
            "latencylab profile: error: argument --iterations: 'ten' is not an integer",
        ),
        (
            ["profile", "--min-time", "-3"],
            "latencylab profile: error: argument --min-time: -3 must be a positive number",
        ),
        (
            ["profile", "--workload", "nope"],
            "latencylab profile: error: unknown workload 'nope'; "
            "choose one of compiled, gen, onnx, synthetic, text, vision",
        ),
        (
            ["profile", "--pipeline", "nomodule"],
            "latencylab profile: error: pipeline spec 'nomodule' must look like package.module:factory",
        ),
        (
            ["profile", "--pipeline", "no_such_mod_xyz:f"],
            "latencylab profile: error: cannot import module 'no_such_mod_xyz' from pipeline spec: "
            "No module named 'no_such_mod_xyz'",
        ),
        (
            ["profile", "--pipeline", "json:nothing"],
            "latencylab profile: error: module 'json' has no callable 'nothing'",
        ),
        (["profile", "--pipeline", "json:dumps"], None),
        (["profile", "--model", "/nonexistent/m.onnx"], None),
        (
            ["profile", "--workload", "synthetic", "--param", "stages=fwd:gauss(1ms)"],
            "latencylab profile: error: unknown distribution 'gauss': constant, normal, lognormal, uniform",
        ),
        (
            ["profile", "--workload", "synthetic", "--param", "oops"],
            "latencylab profile: error: --param 'oops' must look like key=value",
        ),
        (
            ["profile", "--device", "tpu"],
            "latencylab profile: error: --device must be cpu or cuda[:N], got 'tpu'",
        ),
        (
            ["profile", "--iterations", "5", "--adaptive"],
            "latencylab profile: error: argument --adaptive: not allowed with argument --iterations",
        ),
        (
            ["serve", "--model", "vision", "--itl-cap-yield"],
            "latencylab serve: error: --itl-cap-ms and --itl-cap-yield are for --model gen (a generative model's "
            "steps)",
        ),
        (
            ["serve", "--model", "text", "--spec-lookup", "4"],
            "latencylab serve: error: --gen-engine and --spec-lookup are for --model gen (a generative model's steps)",
        ),
        (["env", "--diff", "/nonexistent/a.json", "/nonexistent/b.json"], None),
        (["bogus"], None),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args: list[str], message: str | None, tmp_path: Path) -> None:
    p = run(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1, p.stderr
    assert "Traceback" not in p.stderr
    if message is not None:
        assert err[0] == message


def test_corrupt_model_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "m.onnx"
    bad.write_bytes(b"\x00garbage" * 10)
    p = run("profile", "--model", str(bad), "--iterations", "3")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1
    assert "m.onnx" in p.stderr and "Traceback" not in p.stderr


def test_user_pipeline_factory(tmp_path: Path) -> None:
    (tmp_path / "mypipe.py").write_text(
        "from latencylab import Pipeline\n"
        "def make():\n"
        "    return Pipeline('mine', source=lambda i: i).stage('double', lambda x: x * 2, kind='forward')\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "profile", "--pipeline", "mypipe:make", "--iterations", "50"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert p.returncode == 0, p.stderr
    assert "latencylab profile: mine (50 iterations" in p.stdout
    assert "double" in p.stdout


def test_prepare_names_unknown_steps_in_one_line() -> None:
    p = run("prepare", "--only", "vision,nope")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "unknown step(s) nope; choose from vision, gen, gen-reference, roofline" in p.stderr


@pytest.mark.slow
def test_prepare_builds_a_cache_once_and_hits_it_after(tmp_path: Path) -> None:
    env = {**os.environ, "LATENCYLAB_CACHE": str(tmp_path)}
    first = subprocess.run(
        [sys.executable, "-m", "latencylab", "prepare", "--only", "roofline"], capture_output=True, text=True, env=env
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("prepare roofline: peaks of this machine"), first.stdout
    files = sorted((tmp_path / "roofline").glob("peaks-*-quick.json"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    again = subprocess.run(
        [sys.executable, "-m", "latencylab", "prepare", "--only", "roofline"], capture_output=True, text=True, env=env
    )
    assert again.returncode == 0 and files[0].stat().st_mtime_ns == stamp  # read, not measured again

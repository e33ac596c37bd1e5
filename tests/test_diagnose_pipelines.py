"""diagnose on user pipelines with planted problems (tests/planted.py), with no probe and no hints.

Each planted cause must be named with its stage, its iterations or share, and its effect; a clean control
must give no finding on a quiet machine; a pipeline cycling through a fixed input set must give no periodic
finding. Real runs on real clocks: the planted effects are large enough to stand out on a busy machine, and
the test that needs a quiet machine (the control) measures that and skips with the figures when it is not.
Also: what the profiler records by itself (``latencylab.autoprobe``), and ``diagnose --pipeline`` /
``--deep RESULT.json`` / ``--roofline`` on a user pipeline's result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import planted
from latencylab import autoprobe, env
from latencylab.cli import main
from latencylab.diagnose.engine import diagnose_results, loaded
from latencylab.diagnose.frontend import LIVE_WARMUP, diagnose
from latencylab.diagnose.rules.periodic import find_period
from latencylab.findings import Finding
from latencylab.profiler import ProfileConfig, profile
from latencylab.results import ProfileResult

WARMUP = 5


def _run(pipe: Any, iterations: int) -> tuple[ProfileResult, list[Finding]]:
    res = profile(pipe, ProfileConfig(warmup=WARMUP, iterations=iterations))
    return res, diagnose_results([loaded(res.to_dict(), "planted.json")])


def _cli_findings(tmp_path: Path, *args: str) -> list[Finding]:
    out = tmp_path / "d.json"
    assert main(["diagnose", *args, "--quiet", "--json", str(out)]) == 0
    return [Finding.from_dict(d) for d in json.loads(out.read_text())["findings"]]


def _one(findings: list[Finding], rule: str) -> Finding:
    got = [f for f in findings if f.rule == rule]
    assert len(got) == 1, [(f.rule, f.title) for f in findings]
    return got[0]


# ------------------------------------------------------------------ what the profiler records by itself


def test_shapes_lengths_and_input_keys_from_plain_inputs() -> None:
    ids = np.zeros((3, 7), dtype=np.int64)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    enc = {"input_ids": ids, "attention_mask": mask}
    assert autoprobe.input_shape(enc) == [3, 7] and autoprobe.input_lengths(enc) == [7, 4, 2]
    assert autoprobe.input_shape((np.ones((2, 5)),)) == [2, 5] and autoprobe.input_shape("text") is None
    assert autoprobe.input_lengths(np.ones((2, 2))) is None
    a, b = np.arange(1000.0), np.arange(1000.0)
    assert autoprobe.input_key(a) == autoprobe.input_key(b) != autoprobe.input_key(a + 1)
    assert autoprobe.input_key(["x", "y"]) == autoprobe.input_key(["x", "y"]) != autoprobe.input_key(["x", "z"])
    assert autoprobe.input_key(object()) is None


def test_lengths_from_a_real_tokenizer_output() -> None:
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer

    from latencylab.workloads.text import model_dir

    tok = AutoTokenizer.from_pretrained(model_dir())
    enc = tok(["a short one", "a much longer sentence than the first one here"], padding=True, return_tensors="pt")
    real = [len(tok(t)["input_ids"]) for t in ("a short one", "a much longer sentence than the first one here")]
    assert autoprobe.input_shape(enc) == [2, max(real)] and autoprobe.input_lengths(enc) == real
    assert isinstance(enc["input_ids"], torch.Tensor)


def test_busy_is_judged_by_the_run_not_the_load_average() -> None:
    fp: dict[str, Any] = {"cpu": {"logical_cpus": 2, "governor": "performance"}, "load": {"loadavg_1": 3.0}}
    quiet = {"cpus": 2, "others_cpu_cores": 0.04, "others_cpu_fraction": 0.02, "steal_fraction": 0.0,
             "self_cpu_cores": 1.0, "involuntary_switches_per_s": 3.0}  # fmt: skip
    assert autoprobe.busy_verdict({**fp, "run": quiet}) == (False, autoprobe.busy_verdict({**fp, "run": quiet})[1])
    assert "busy" not in [w.code for w in env.lint({**fp, "run": quiet})]  # load average 3.0 on 2 CPUs: ignored
    busy = {**quiet, "others_cpu_cores": 1.2, "others_cpu_fraction": 0.6}
    (w,) = [w for w in env.lint({**fp, "run": busy}) if w.code == "busy"]
    assert "other processes used 1.20 of 2 CPUs (60%)" in w.message
    assert autoprobe.busy_verdict({**fp, "run": {**quiet, "steal_fraction": 0.08}})[0]  # type: ignore[index]
    assert "busy" in [w.code for w in env.lint(fp)]  # a bare fingerprint (no run measured): as before


def test_profile_records_the_run_and_threads_after_warm_up() -> None:
    res, _ = _run(planted.make_control(), 30)
    run = res.env["run"]
    assert run["wall_s"] > 0 and 0 <= run["others_cpu_fraction"] <= 1 and run["cpus"] >= 1
    assert "threads" in res.env["after_warmup"]
    assert "input" not in res.iteration_meta and "shape" not in res.iteration_meta  # constant: dropped


# ------------------------------------------------------------------ planted causes, named without a probe


def test_data_path_share_and_the_python_function(tmp_path: Path) -> None:
    pipe = planted.make_data_path()
    _, fs = _run(pipe, 150)
    f = _one(fs, "preprocess-dominates")
    assert f.title.startswith("data path normalise is") and f.details["top_stage"] == "normalise"
    # an independent timing of the two stages, interleaved, medians of 15 calls each
    import time

    img = pipe.source(0)
    t_norm, t_fwd = [], []
    for _ in range(15):
        t0 = time.perf_counter()
        x = planted.python_normalise(img)
        t1 = time.perf_counter()
        pipe.stages[1].fn(x)
        t_fwd.append(time.perf_counter() - t1)
        t_norm.append(t1 - t0)
    expected = np.median(t_norm) / (np.median(t_norm) + np.median(t_fwd))
    assert f.details["shares"]["normalise"] == pytest.approx(expected, abs=0.15)
    assert f.details["data_share"] >= 0.5 and f.severity == "critical"
    # --deep through the CLI on a live --pipeline run: the advice names the user's function
    deep = _one(_cli_findings(tmp_path, "--pipeline", "planted:make_data_path", "--deep"), "preprocess-dominates")
    assert deep.details["user_function"]["name"].startswith("python_normalise (planted.py:")
    assert "your Python function python_normalise" in deep.recommendation
    assert deep.source == "live run (planted:make_data_path)"


def test_repeated_pauses_named_with_stage_period_iterations_and_effect(tmp_path: Path) -> None:
    base, pause = planted.PAUSE_BASE_MS, planted.PAUSE_MS
    assert (base + pause) / base < 10  # the old rule (10 x the median) cannot see these
    fs = _cli_findings(tmp_path, "--pipeline", "planted:make_pauses")
    found_pauses = [f for f in fs if f.rule == "stall" and "period" in f.details]
    busy = [e.value for f in fs if f.rule == "noisy-environment" for e in f.evidence if e.label == "busy"]
    if not found_pauses and busy:  # preemptions as long and as frequent as the pauses drown them
        pytest.skip(f"planted pauses drowned by the machine's own stalls: {busy[0]}")
    (f,) = found_pauses
    assert f.details["stage"] == "forward" and f.details["period"] == planted.PAUSE_EVERY
    found = f.details["iterations"]
    n = max(found) + 1
    want = [t for t in range(n) if (t + LIVE_WARMUP) % planted.PAUSE_EVERY == planted.PAUSE_PHASE]
    # all planted pauses but those a busy machine hid inside a latency jump; hardly any others
    assert len(set(want) & set(found)) >= 0.9 * len(want) and len(set(found) - set(want)) <= len(want) // 10
    assert np.median(f.details["excess_ms"]) == pytest.approx(pause, abs=0.5 * pause)
    assert f.details["effect"]["share"] == pytest.approx(pause / (base * planted.PAUSE_EVERY + pause), rel=0.5)
    # 2-3% of iterations pause, so they hold the p99 tail unless a busy machine's longer preemptions do
    assert 0.0 <= f.details["effect"]["tail_share"] <= 1.0 and "of the p99 tail" in f.title
    assert "forward pauses every 29 iterations" in f.title and "of end-to-end time" in f.title
    assert not [g for g in fs if g.rule == "periodic-swings" and round(g.details["period"]) % 29 == 0]


@pytest.mark.slow
def test_recompiles_found_without_a_probe() -> None:
    pytest.importorskip("torch")
    pipe = planted.make_recompiles()
    assert pipe.probe is None
    n = planted.RECOMPILE_EVERY * len(planted.RECOMPILE_LENGTHS)
    res, fs = _run(pipe, n)
    # a new length every RECOMPILE_EVERY iterations (the first compiled in warm-up; the cycle's restart is cached)
    new = [k * planted.RECOMPILE_EVERY - WARMUP for k in range(1, len(planted.RECOMPILE_LENGTHS))]
    want = [t for t in new if 0 <= t < n]
    assert [i for i, c in enumerate(res.iteration_meta["compiles"]) if c] == want
    assert res.pipeline["observed"]["shape_stage"] == "forward"
    f = _one(fs, "recompilation")
    assert f.severity == "critical" and f.details["compile_iterations"] == want and f.details["stage"] == "forward"
    assert f"recompiled {len(want)} times in forward" in f.title and "(2, 20, 24)" in f.title
    assert f.details["effect"]["tail_share"] >= 0.5 and f.details["effect"]["share"] > 0.01
    assert not [g for g in fs if g.rule == "periodic-swings"]  # the recompilations explain the rhythm
    assert not [g for g in fs if g.rule == "stall" and set(g.details.get("iterations", [])) & set(want)]


def test_padding_found_without_a_probe() -> None:
    _, fs = _run(planted.make_padding(), 240)
    f = _one(fs, "shape-variance")
    real = [x for i in range(WARMUP, WARMUP + 240) for x in planted.pad_lengths(i)]
    padded = [max(planted.pad_lengths(i)) for i in range(WARMUP, WARMUP + 240) for _ in range(planted.PAD_BATCH)]
    assert f.details["waste"] == pytest.approx((sum(padded) - sum(real)) / sum(real), rel=1e-9)
    assert "input lengths into forward vary" in f.title and f.details["iterations"] == 240
    cost = f.details["cost"]
    assert cost is not None and cost["stage"] == "forward" and 0.05 < cost["stage_share"] < 1.0
    assert "padding costs" in f.title


@pytest.mark.slow
def test_threads_set_on_the_first_call_are_seen_and_their_cost_measured() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0))
    try:
        fs, _ = diagnose(pipeline="planted:make_threads")
    finally:
        torch.set_num_threads(before)
    change = _one(fs, "thread-change")
    assert change.details["changes"][0]["after"] == planted.threads_planted(cpus)
    over = _one(fs, "thread-oversubscription")
    assert over.details["threads"] == planted.threads_planted(cpus) and over.details["cpus"] == cpus
    assert {e.label: e.value for e in over.evidence}["threads come from"].endswith("(read after warm-up)")
    cost = over.details["cost"]
    assert cost["measured"] and cost["threads"] == planted.threads_planted(cpus) and cost["cpus"] == cpus
    assert cost["p50_ms"] > 0 and cost["p50_fixed_ms"] > 0 and "measured: p50" in over.title


# ------------------------------------------------------------------ no false alarms


def test_clean_control_gives_no_finding_on_a_quiet_machine() -> None:
    res, fs = _run(planted.make_control(), 1200)
    verdict = autoprobe.busy_verdict(res.env)
    assert verdict is not None
    if verdict[0]:
        pytest.skip(f"cannot judge a false alarm on a busy machine: {verdict[1]}")
    speed = [f for f in fs if f.rule == "machine-speed"]
    if speed and len(speed) == len(fs):  # the machine itself changed speed (the canary says so): not quiet
        pytest.skip(f"cannot judge a false alarm while the machine's speed moves: {speed[0].title}")
    assert fs == [], [f.title for f in fs]


def test_a_cycled_input_set_is_no_periodic_finding() -> None:
    res, fs = _run(planted.make_cycle(), 24 * 30)
    raw = find_period(res.end_to_end_ns())  # the rhythm is there: the inputs cycle every 24 iterations
    verdict = autoprobe.busy_verdict(res.env)
    if (raw is None or round(raw.period) % planted.CYCLE) and verdict is not None and verdict[0]:
        pytest.skip(f"the machine's noise hides the input cycle itself, nothing to rule out: {verdict[1]}")
    assert raw is not None and round(raw.period) % planted.CYCLE == 0
    assert len(set(res.iteration_meta["input"])) == planted.CYCLE
    assert not [f for f in fs if f.rule == "periodic-swings"], [f.title for f in fs]
    assert not [f for f in fs if f.rule == "stall" and f.details.get("period", 1) % planted.CYCLE == 0]


# ------------------------------------------------------------------ --deep / --roofline on a pipeline result


def test_deep_on_a_pipeline_result_reimports_its_factory_not_a_namesake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "vision.json"
    args = ["profile", "--pipeline", "planted:make_vision", "--iterations", "60", "--quiet", "--json", str(src)]
    assert main(args) == 0
    doc = json.loads(src.read_text())
    assert doc["workload"] == "vision" and doc["pipeline"]["metadata"]["factory"] == "planted:make_vision"
    fs = _cli_findings(tmp_path, str(src), "--deep")
    stage = _one(fs, "sandwich-stage")
    assert stage.source == "live run (planted:make_vision, --deep)"
    assert stage.details["stage"] in ("load_img", "classify")
    ops = _one(fs, "sandwich-operators")
    assert ops.details["stage"] == stage.details["stage"]
    capsys.readouterr()
    # --roofline: one clear line
    assert main(["diagnose", str(src), "--roofline"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "planted:make_vision" in err and "nothing to place" in err
    # a result without its factory, named like a built-in whose stages differ: refused, never swapped
    doc["workload"] = "synthetic"
    del doc["pipeline"]["metadata"]["factory"]
    other = tmp_path / "old.json"
    other.write_text(json.dumps(doc))
    assert main(["diagnose", str(other), "--deep"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not those of the built-in synthetic workload" in err and "--pipeline MOD:FACTORY" in err

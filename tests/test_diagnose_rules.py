"""Every diagnose rule on synthetic results: one that must fire (with the right numbers) and a clean one that
must not (no false alarm), plus the engine (loading, ordering, JSON) and the per-iteration metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.cli import main
from latencylab.diagnose.engine import diagnose_results, findings_doc, load_result, loaded
from latencylab.diagnose.rules import (
    RULES,
    batching,
    environment,
    periodic,
    preprocess,
    shapes,
    spikes,
    transfer,
    variants,
)
from latencylab.diagnose.rules.periodic import find_period
from latencylab.errors import LatencyLabError
from latencylab.findings import Finding
from latencylab.optimize.buckets import choose_buckets
from latencylab.results import LoadedResult, ProfileResult, StageSeries

CLEAN_ENV: dict[str, Any] = {
    "cpu": {"logical_cpus": 8, "affinity": 8, "governor": "performance"},
    "load": {"loadavg_1": 0.1, "cpu_percent": 2.0},
    "threads": {"torch_intra_op": 4, "env": {"OMP_NUM_THREADS": None}},
    "process": {"debugger": False, "coverage": False},
    "python": {"debug_build": False},
}


def _profile(
    stages: Mapping[str, tuple[str, Any]],
    *,
    gaps_ns: float = 0.0,
    meta: Mapping[str, Sequence[Any]] | None = None,
    env: Mapping[str, Any] | None = None,
    device: str = "cpu",
    clock: str = "perf_counter_ns",
) -> LoadedResult:
    """A profile result from per-stage durations in ns (iterations back to back, plus ``gaps_ns`` between)."""
    series = [StageSeries(name, kind, tuple(int(v) for v in vals)) for name, (kind, vals) in stages.items()]
    e2e = np.sum([s.samples_ns for s in series], axis=0)
    starts = np.r_[0, np.cumsum(e2e[:-1] + gaps_ns)].astype(np.int64)
    res = ProfileResult(
        workload="synthetic",
        stages=tuple(series),
        iteration_start_ns=tuple(int(v) for v in starts),
        clock=clock,
        config={"threads": None},
        pipeline={"name": "synthetic", "device": device, "stages": [], "metadata": {}},
        env=dict(env if env is not None else CLEAN_ENV),
        stop_reason="iterations reached",
        warmup_iterations=0,
        wall_time_s=float(starts[-1] + e2e[-1]) / 1e9,
        iteration_meta={k: tuple(v) for k, v in (meta or {}).items()},
    )
    return loaded(res.to_dict(), "synthetic.json")


def _noise(n: int, median_ns: float, sigma: float = 0.05, seed: int = 0) -> np.ndarray:
    return median_ns * np.exp(np.random.default_rng(seed).normal(0, sigma, n))


def _rules(findings: Sequence[Finding]) -> list[str]:
    return [f.rule for f in findings]


# ------------------------------------------------------------------ 1. preprocessing dominates


def test_preprocess_dominates_fires_with_shares() -> None:
    n = 200
    r = _profile(
        {
            "decode": ("load", _noise(n, 4e5, seed=1)),
            "preprocess": ("preprocess", _noise(n, 2.5e5, seed=2)),
            "forward": ("forward", _noise(n, 3.5e5, seed=3)),
        }
    )
    (f,) = preprocess.rule([r])
    assert f.rule == "preprocess-dominates" and f.severity == "critical"
    assert f.details["data_share"] == pytest.approx(0.65, abs=0.01)
    assert f.details["top_stage"] == "decode"
    assert "decode + preprocess are 65%" in f.title
    assert "nvJPEG" in f.recommendation and "double buffering" in f.recommendation
    assert {e.label: e.value for e in f.evidence}["data path share (load + preprocess)"] == pytest.approx(65.0, abs=1)


def test_preprocess_tokenizer_remedy_and_warning_band() -> None:
    n = 100
    r = _profile({"tokenize": ("preprocess", _noise(n, 4e5)), "forward": ("forward", _noise(n, 6e5, seed=4))})
    (f,) = preprocess.rule([r])
    assert f.severity == "warning" and "tokenize whole batches" in f.recommendation


def test_preprocess_clean_run_has_no_finding() -> None:
    n = 200
    r = _profile({"preprocess": ("preprocess", _noise(n, 1e5)), "forward": ("forward", _noise(n, 9e5, seed=5))})
    assert preprocess.rule([r]) == []


# ------------------------------------------------------------------ 2. latency jumps, stalls, recompilation


def test_two_recompilations_inside_one_excursion_are_two_findings() -> None:
    """Shape 32 is 2.5x slower than shape 16, so the latency stays up from the first recompilation (250) past the
    second (350): one long excursion holding two compile events, each reported on its own."""
    n = 600
    fwd = _noise(n, 2e5)
    fwd[250:400] *= 2.5
    fwd[250] += 90e6
    fwd[350] += 90e6
    shape = [[1, 16, 32]] * 250 + [[1, 32, 32]] * 100 + [[1, 48, 32]] * 50 + [[1, 16, 32]] * 200
    compiles = [0] * n
    compiles[250] = compiles[350] = 1
    r = _profile({"forward": ("forward", fwd)}, meta={"shape": shape, "compiles": compiles})
    rec = [f for f in spikes.rule([r]) if f.rule == "recompilation"]
    assert [f.title.split(":")[0] for f in rec] == [
        "recompiled at iteration 250 (shape (1, 32, 32))",
        "recompiled at iteration 350 (shape (1, 48, 32))",
    ]
    assert [f.details["compile_iterations"] for f in rec] == [[250], [350]]
    assert rec[0].details["spike"] == rec[1].details["spike"]  # one excursion, two causes
    labels = {e.label: e.value for e in rec[1].evidence}
    assert labels["shape before"] == "(1, 32, 32)"


def test_level_shift_found_with_its_range() -> None:
    x = _noise(1000, 1e6)
    x[400:500] *= 2.2
    r = _profile({"forward": ("forward", x)})
    (f,) = spikes.rule([r])
    assert f.rule == "latency-jump" and f.severity == "critical"
    assert f.details["spike"]["start"] == 400 and f.details["spike"]["end"] == 500
    it = next(e for e in f.evidence if e.label == "iterations")
    assert it.value == "400-499 (100)"
    assert it.t_start_s == pytest.approx(float(x[:400].sum()) / 1e9)


def test_recompilation_named_with_iteration_and_shape() -> None:
    n = 600
    fwd = _noise(n, 2e5)
    fwd[250] += 90e6  # the compile happened inside this forward call
    shape = [[1, 16, 32]] * 250 + [[1, 32, 32]] * 350
    compiles = [0] * n
    compiles[250] = 1
    r = _profile(
        {"prepare": ("preprocess", _noise(n, 2e4)), "forward": ("forward", fwd)},
        meta={"shape": shape, "compiles": compiles, "compile_s": [0.0] * 250 + [0.089] + [0.0] * 349},
    )
    (f,) = spikes.rule([r])
    assert f.rule == "recompilation" and f.severity == "critical"
    assert f.title.startswith("recompiled at iteration 250 (shape (1, 32, 32))")
    labels = {e.label: e.value for e in f.evidence}
    assert labels["shape before"] == "(1, 16, 32)"
    assert labels["compile event at iteration 250"] == "1 compile(s), shape (1, 32, 32), 89.0 ms compiling"
    assert str(labels["stage that grew most"]).startswith("forward")


def test_compile_event_without_spike_still_reported() -> None:
    n = 300
    compiles = [0] * n
    compiles[100] = 1
    r = _profile({"forward": ("forward", _noise(n, 1e6))}, meta={"compiles": compiles})
    (f,) = spikes.rule([r])
    assert f.rule == "recompilation" and f.severity == "warning" and "iteration 100" in f.title


def test_stalls_grouped() -> None:
    x = _noise(500, 1e6)
    x[[100, 300]] = 50e6
    (f,) = spikes.rule([_profile({"forward": ("forward", x)})])
    assert f.rule == "stall" and f.title.startswith("2 isolated stall(s)")


def test_spikes_clean_run_has_no_finding() -> None:
    assert spikes.rule([_profile({"forward": ("forward", _noise(2000, 1e6, sigma=0.1))})]) == []


def test_load_timeline_jump() -> None:
    tl = [{"t_s": float(t), "ok": 100, "p50_ms": 10.0 * (2.5 if 20 <= t < 30 else 1.0)} for t in range(40)]
    doc = {"kind": "load", "schema_version": 1, "timeline": tl, "env": CLEAN_ENV}
    (f,) = spikes.rule([loaded(doc, "load.json")])
    assert f.rule == "latency-jump" and "between 20 s and 30 s" in f.title


# ------------------------------------------------------------------ 3. periodic swings


def test_find_period_of_a_rhythm() -> None:
    i = np.arange(1000)
    x = 1e6 * (1 + 0.3 * np.sin(2 * np.pi * i / 25)) * np.exp(np.random.default_rng(0).normal(0, 0.05, 1000))
    p = find_period(x)
    assert p is not None and p.period == pytest.approx(25, abs=0.3) and p.amplitude > 0.4


def test_periodic_profile_and_load_fire() -> None:
    i = np.arange(800)
    x = 1e6 * (1 + 0.3 * np.sin(2 * np.pi * i / 40)) * np.exp(np.random.default_rng(1).normal(0, 0.05, 800))
    (f,) = periodic.rule([_profile({"forward": ("forward", x)})])
    assert f.rule == "periodic-swings" and f.details["period"] == pytest.approx(40, abs=0.5)
    assert f.details["period_s"] == pytest.approx(40 * float(x.mean()) / 1e9, rel=0.02)
    tl = [{"t_s": float(t), "ok": int(100 + 40 * (t % 6 < 3)), "p50_ms": 5.0} for t in range(60)]
    (g,) = periodic.rule([loaded({"kind": "load", "timeline": tl}, "load.json")])
    assert g.details["period"] == pytest.approx(6, abs=0.3) and "throughput" in g.title


def test_periodic_no_false_alarm_on_noise_or_a_step() -> None:
    noise = _noise(2000, 1e6, sigma=0.2, seed=7)
    step = _noise(2000, 1e6, seed=8)
    step[1000:] *= 2
    assert find_period(noise) is None and find_period(step) is None
    assert periodic.rule([_profile({"forward": ("forward", noise)})]) == []


# ------------------------------------------------------------------ 4. shape variance


def test_shape_variance_recommends_buckets() -> None:
    rng = np.random.default_rng(3)
    lens = np.clip(np.round(np.exp(rng.normal(3.0, 0.8, 400))), 3, 256).astype(int).tolist()
    r = _profile(
        {"tokenize": ("preprocess", _noise(400, 1e5)), "forward": ("forward", _noise(400, 1e6))},
        meta={"shape": [[1, n] for n in lens], "lengths": [[n] for n in lens]},
    )
    (f,) = shapes.rule([r])
    edges = choose_buckets(lens, coverage=0.95, k=3, multiple=8)
    assert f.details["edges"] == edges and str(edges) in f.recommendation
    assert f.details["waste"] == 0.0  # one item at a time, padded to itself
    assert f.details["waste_batched"] > 0.25 and f.details["waste_bucketed"] < f.details["waste_batched"]


def test_shape_variance_padding_to_max_length() -> None:
    lens = [8, 12, 30, 9, 100, 15, 11, 40] * 20
    r = _profile(
        {"forward": ("forward", _noise(160, 1e6))}, meta={"shape": [[1, 128]] * 160, "lengths": [[n] for n in lens]}
    )
    (f,) = shapes.rule([r])
    assert f.details["waste"] == pytest.approx((128 * 160 - sum(lens)) / sum(lens))
    assert "padding wastes" in f.title


def test_shape_variance_clean() -> None:
    r = _profile({"forward": ("forward", _noise(100, 1e6))}, meta={"shape": [[1, 32]] * 100, "lengths": [[32]] * 100})
    assert shapes.rule([r]) == []


def _policy_doc(fixed_waste: float) -> dict[str, Any]:
    pol = lambda name, w, shp: {"name": name, "padded_per_real_token": w, "shapes": shp,  # noqa: E731
                                "timing": {"per_item_ms": {"p50": 1.0 + w}}}  # fmt: skip
    return {
        "kind": "shape-policy", "schema_version": 1, "batch_size": 8, "bucket_edges": [16, 32, 64],
        "policies": [pol("fixed-128", fixed_waste, [128]), pol("exact", 0.2, list(range(9, 120))),
                     pol("buckets", 0.35, [16, 32, 64, 128])],
        "winner": "exact", "conclusion": "exact padding is fastest.",
    }  # fmt: skip


def test_shape_policy_result() -> None:
    (f,) = shapes.rule([loaded(_policy_doc(3.2), "shape.json")])
    assert "padding to 128 wastes 3.20" in f.title and "[16, 32, 64]" in f.recommendation
    assert shapes.rule([loaded(_policy_doc(0.1), "shape.json")]) == []


# ------------------------------------------------------------------ 5. batch sweep


def _sweep(tput: dict[int, float], strict: list[str], loose: list[str]) -> LoadedResult:
    doc = {
        "kind": "sweep", "schema_version": 1, "knob": "batch",
        "items_per_s_from_p50": {str(k): v for k, v in tput.items()}, "best": max(tput, key=lambda b: tput[b]),
        "non_monotonic": loose, "non_monotonic_significant": strict,
    }  # fmt: skip
    return loaded(doc, "sweep.json")


def test_batch_non_monotonic() -> None:
    flag = "batch 8: at most 900 items/s, below batch 4's at least 1100 (p50 95% CIs)"
    (f,) = batching.rule([_sweep({1: 500.0, 4: 1200.0, 8: 850.0}, [flag], ["batch 8: ..."])])
    assert f.severity == "warning" and "batch 8" in f.title and "cap the batch at 4" in f.recommendation
    (g,) = batching.rule([_sweep({1: 500.0, 4: 1200.0, 8: 1190.0}, [], ["batch 8: 1190 < 1200"])])
    assert g.severity == "info"
    assert batching.rule([_sweep({1: 500.0, 4: 1200.0, 8: 1500.0}, [], [])]) == []


# ------------------------------------------------------------------ 6. transfer, threads, noisy machine


def test_transfer_blocking_on_gpu_data() -> None:
    n = 200
    stages = {
        "preprocess": ("preprocess", _noise(n, 2e5)),
        "transfer": ("transfer", _noise(n, 4e5, seed=9)),
        "forward": ("forward", _noise(n, 3e5, seed=10)),
    }
    (f,) = transfer.rule([_profile(stages, gaps_ns=3e5, device="cuda:0", clock="cuda_event")])
    assert f.rule == "transfer-blocking" and f.severity == "critical"
    assert f.details["transfer_share"] == pytest.approx(4 / 9, abs=0.02)
    assert f.details["busy"] == pytest.approx(3 / 12, abs=0.02)
    assert transfer.rule([_profile(stages, device="cpu")]) == []  # CPU data cannot show it


def test_transfer_clean_gpu_run() -> None:
    n = 200
    stages = {"transfer": ("transfer", _noise(n, 1e4)), "forward": ("forward", _noise(n, 1e6, seed=11))}
    assert transfer.rule([_profile(stages, device="cuda", clock="cuda_event")]) == []


def test_thread_oversubscription() -> None:
    env = {**CLEAN_ENV, "cpu": {"logical_cpus": 2, "affinity": 2, "governor": "performance"}}
    doc = {"kind": "serve", "schema_version": 1, "env": env, "config": {"workers": 2}}
    fs = environment.rule([loaded(doc, "serve.json")])
    (f,) = [f for f in fs if f.rule == "thread-oversubscription"]
    assert f.title == "4 threads x 2 process(es) = 8 threads on 2 usable CPUs"
    assert "at most 1 intra-op thread" in f.recommendation


def test_noisy_environment_merges_sources() -> None:
    env = {**CLEAN_ENV, "load": {"loadavg_1": 6.0, "cpu_percent": 90.0}, "process": {"debugger": True}}
    docs = [loaded({"kind": "load", "env": env}, "a.json"), loaded({"kind": "load", "env": env}, "b.json")]
    (f,) = environment.rule(docs)
    assert f.rule == "noisy-environment" and f.severity == "critical"
    assert {e.label for e in f.evidence} == {"busy", "debugger"} and f.source == "a.json, b.json"


def test_environment_clean() -> None:
    assert environment.rule([loaded({"kind": "load", "env": CLEAN_ENV}, "a.json")]) == []


# ------------------------------------------------------------------ 7. optimize variants


def _cand(name: str, family: str, p50: float, backend: str = "torch") -> dict[str, Any]:
    return {"name": name, "family": family, "backend": backend, "status": "inside-budget", "p50_ms": p50,
            "p50_ci_ms": [p50 * 0.98, p50 * 1.02]}  # fmt: skip


def _opt(cands: list[dict[str, Any]]) -> LoadedResult:
    doc = {"kind": "optimize", "schema_version": 1, "summary": {"baseline": {"name": "torch-fp32"}},
           "candidates": cands, "env": {"cpu": {"isa": ["avx2", "fma"]}}}  # fmt: skip
    return loaded(doc, "opt.json")


def test_int8_slower_and_prune_no_faster() -> None:
    cands = [
        _cand("torch-fp32", "precision", 1.0),
        _cand("torch-int8-dynamic", "int8-dynamic", 1.4),
        _cand("ort-fp32", "graph", 0.8, "onnxruntime"),
        _cand("ort-int8-dynamic-default", "int8-dynamic", 0.7, "onnxruntime"),  # faster than ort-fp32: fine
        _cand("torch-prune-unstructured-50", "prune", 0.99),
    ]
    fs = variants.rule([_opt(cands)])
    assert _rules(fs) == ["int8-slower", "prune-no-faster"]
    assert fs[0].title.startswith("INT8 variant torch-int8-dynamic is 1.40x slower than float torch-fp32")
    assert "no int8 dot-product instructions" in fs[0].recommendation
    assert "structured pruning" in fs[1].recommendation


def test_variants_clean() -> None:
    cands = [
        _cand("torch-fp32", "precision", 1.0),
        _cand("torch-int8-dynamic", "int8-dynamic", 0.6),
        _cand("torch-prune-structured-50", "prune", 0.7),
        _cand("torch-int8-noise", "int8-dynamic", 1.02),  # inside the float CI: not slower
    ]
    assert variants.rule([_opt(cands)]) == []


# ------------------------------------------------------------------ engine, CLI, metadata


def test_registry_and_ordering() -> None:
    assert set(RULES) >= {"preprocess-dominates", "spikes", "periodic-swings", "shape-variance",
                          "batch-non-monotonic", "transfer-blocking", "environment", "variants"}  # fmt: skip
    n = 300
    x = _noise(n, 2e5)
    env = {**CLEAN_ENV, "cpu": {**CLEAN_ENV["cpu"], "governor": "powersave"}}
    r = _profile({"decode": ("load", _noise(n, 1e6)), "forward": ("forward", x)}, env=env)
    fs = diagnose_results([r])
    assert [f.severity for f in fs] == sorted((f.severity for f in fs), key=["critical", "warning", "info"].index)
    assert _rules(fs) == ["preprocess-dominates", "noisy-environment"]


def test_load_result_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    nokind = tmp_path / "nokind.json"
    nokind.write_text("{}")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"kind": "load", "schema_version": 99}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": "profile", "schema_version": 1, "stages": []}))
    cases = [(tmp_path / "none.json", "no such result file"), (bad, "not a JSON result file"), (nokind, "no 'kind'"),
             (old, "unsupported schema_version 99"), (broken, "malformed profile")]  # fmt: skip
    for p, msg in cases:
        with pytest.raises(LatencyLabError, match=msg) as exc:
            load_result(p)
        assert "\n" not in str(exc.value)


def test_cli_json_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 200
    r = _profile({"decode": ("load", _noise(n, 6e5)), "forward": ("forward", _noise(n, 4e5))})
    src = tmp_path / "p.json"
    src.write_text(json.dumps(dict(r.doc)))
    out = tmp_path / "d.json"
    assert main(["diagnose", str(src), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "diagnose" and doc["schema_version"] == 1 and doc["sources"] == [str(src)]
    fs = [Finding.from_dict(d) for d in doc["findings"]]
    assert fs == diagnose_results([load_result(src)])
    text = capsys.readouterr().out
    assert "CRITICAL" in text and "decode is 60% of end-to-end time" in text
    assert findings_doc([])["findings"] == []


def test_cli_needs_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose"]) == 2
    assert "give result files" in capsys.readouterr().err


def test_roofline_missing_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "latencylab.roofline.api", None)  # as if the module were not installed
    src = tmp_path / "p.json"
    src.write_text(json.dumps(dict(_profile({"forward": ("forward", _noise(50, 1e6))}).doc)))
    assert main(["diagnose", str(src), "--roofline"]) == 2
    assert capsys.readouterr().err.strip() == "latencylab diagnose: error: roofline not available"


def test_iteration_meta_round_trip_and_backward_compatible() -> None:
    r = _profile({"forward": ("forward", [1, 2, 3])}, meta={"shape": [[1, 2], [1, 3], [1, 2]], "compiles": [1, 0, 0]})
    back = ProfileResult.from_dict(json.loads(json.dumps(dict(r.doc))))
    assert back.iteration_meta == {"shape": ([1, 2], [1, 3], [1, 2]), "compiles": (1, 0, 0)}
    old = {k: v for k, v in r.doc.items() if k != "iteration_meta"}
    assert ProfileResult.from_dict(old).iteration_meta == {}
    assert "iteration_meta" not in _profile({"forward": ("forward", [1, 2, 3])}).doc
    with pytest.raises(LatencyLabError, match="one value per iteration"):
        _profile({"forward": ("forward", [1, 2, 3])}, meta={"shape": [[1]]})

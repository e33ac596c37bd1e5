"""The roofline: ISA theory, roofline arithmetic, FLOP/byte counts, measured peaks + cache, findings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from latencylab.results import LoadedResult
from latencylab.roofline import model as rmodel
from latencylab.roofline.model import LeverContext, attainable_gflops, place, ridge_point
from latencylab.roofline.theory import (
    CpuInfo,
    choose_clock,
    core_throughput,
    parse_cpuinfo,
    theoretical_peaks,
)

AMD, INTEL = "AuthenticAMD", "GenuineIntel"
AVX2 = {"sse", "sse2", "avx", "fma", "avx2", "clwb"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}

# ------------------------------------------------------------------------------------------ theory (pure)


@pytest.mark.parametrize(
    ("vendor", "family", "flags", "fp32", "int8", "bf16"),
    [
        (AMD, 25, AVX2, 32, 64, None),  # Zen 3 (this machine): 2 x 256-bit FMA, vpmaddubsw, no BF16
        (AMD, 23, AVX2 - {"clwb"}, 16, 32, None),  # Zen 1: 256-bit ops split over 2 x 128-bit pipes
        (AMD, 23, AVX2, 32, 64, None),  # Zen 2
        (AMD, 25, AVX512 | {"avx512_vnni", "avx512_bf16"}, 32, 128, 64),  # Zen 4: AVX-512 double-pumped
        (AMD, 26, AVX512 | {"avx512_vnni", "avx512_bf16"}, 64, 256, 128),  # Zen 5: full 512-bit
        (INTEL, 6, AVX2, 32, 64, None),  # Haswell .. Comet Lake
        (INTEL, 6, AVX512, 64, 128, None),  # Skylake-SP: 2 x 512-bit FMA, no VNNI
        (INTEL, 6, AVX512 | {"avx512_vnni"}, 64, 256, None),  # Cascade Lake
        (INTEL, 6, AVX512 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}, 64, 2048, 1024),
        (INTEL, 6, AVX2 | {"avx_vnni"}, 32, 128, None),  # Alder Lake P-core without AVX-512
        (INTEL, 6, {"sse", "sse2", "avx"}, 16, None, None),  # Sandy Bridge: AVX, no FMA
    ],
)
def test_core_throughput_from_flags(
    vendor: str, family: int, flags: set[str], fp32: float, int8: float | None, bf16: float | None
) -> None:
    tp = core_throughput(vendor, family, flags)
    assert (tp.fp32, tp.int8, tp.bf16) == (fp32, int8, bf16)
    assert tp.isa["bf16"] == "none" if bf16 is None else tp.isa["bf16"] != "none"
    assert tp.assumptions  # every figure says what it assumed


def _cpu(flags: set[str], clock: float | None = 3.0, cores: int = 2) -> CpuInfo:
    return CpuInfo(AMD, 25, 1, "AMD EPYC", frozenset(flags), cores, clock, "given")


def test_theoretical_peaks_scale_with_clock_and_cores() -> None:
    th = theoretical_peaks(_cpu(AVX2, 3.0, 2))
    assert th["fp32"].gflops(1) == pytest.approx(96.0)  # 32 FLOP/cycle x 3 GHz
    assert th["fp32"].gflops(2) == pytest.approx(192.0)
    assert th["fp32"].gflops(16) == pytest.approx(192.0)  # capped at the core count
    assert th["int8"].gflops(1) == pytest.approx(192.0)
    assert th["bf16"].gflops(1) is None and th["bf16"].isa == "none"
    assert theoretical_peaks(_cpu(AVX2, None))["fp32"].gflops(1) is None  # no clock: no peak


def test_choose_clock_prefers_cpufreq_then_a_measured_boost() -> None:
    assert choose_clock(2.0, 3.5, 3.1, 2.45) == (2.0, "given")
    assert choose_clock(None, 3.5, 3.1, 2.45) == (3.5, "cpufreq max")
    assert choose_clock(None, None, 3.1, 2.45) == (3.1, "measured")
    assert choose_clock(None, None, 2.3, 2.45) == (2.45, "cpuinfo MHz (nominal)")  # never below nominal
    assert choose_clock(None, None, None, None) == (None, "cpuinfo MHz (nominal)")


def test_parse_cpuinfo_reads_the_first_block() -> None:
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nflags\t\t: fma avx2\n\nprocessor\t: 1\n"
    info = parse_cpuinfo(text)
    assert info["vendor_id"] == "AuthenticAMD" and info["cpu family"] == "25" and info["flags"] == "fma avx2"
    assert info["processor"] == "0"


# ------------------------------------------------------------------------------------------ roofline (pure)


def test_attainable_and_ridge() -> None:
    assert attainable_gflops(100.0, 20.0, 2.0) == 40.0  # memory roof: 20 GB/s x 2 FLOP/B
    assert attainable_gflops(100.0, 20.0, 10.0) == 100.0  # compute roof
    assert ridge_point(100.0, 20.0) == 5.0


def test_place_memory_bound_point() -> None:
    # 1 GFLOP over 500 MB (2 FLOP/B) in 50 ms: 20 GFLOP/s achieved of min(100, 20 x 2) = 40 attainable
    p = place("x", "fp32", 1e9, 5e8, 0.05, 100.0, 20.0, context=LeverContext(weight_bytes=4e8))
    assert p.achieved_gflops == pytest.approx(20.0)
    assert p.intensity == pytest.approx(2.0)
    assert p.attainable_gflops == pytest.approx(40.0)
    assert p.pct_of_attainable == pytest.approx(0.5)
    assert p.bound == "memory"
    assert p.lever == "precision"  # weights are 80% of the bytes and still FP32
    q = place("x", "int8", 1e9, 5e8, 0.05, 100.0, 20.0, context=LeverContext(weight_bytes=4e8))
    assert q.lever == "batching"  # already 1 byte per weight: reuse each read instead
    r = place("x", "fp32", 1e9, 5e8, 0.05, 100.0, 20.0, context=LeverContext(weight_bytes=1e8))
    assert r.lever == "fusion"  # activations dominate
    assert rmodel.RooflinePoint.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_place_compute_bound_point_and_levers() -> None:
    # 10 GFLOP over 100 MB (100 FLOP/B) in 125 ms: 80 of 100 GFLOP/s attainable (compute roof)
    p = place("x", "fp32", 1e10, 1e8, 0.125, 100.0, 20.0, threads=2, theoretical_gflops=160.0)
    assert (p.bound, p.achieved_gflops, p.attainable_gflops) == ("compute", pytest.approx(80.0), 100.0)
    assert p.pct_of_attainable == pytest.approx(0.8) and p.pct_of_theoretical == pytest.approx(0.5)
    assert p.lever == "none"
    pad = place("x", "fp32", 1e10, 1e8, 0.125, 100.0, 20.0, context=LeverContext(padding_fraction=0.75))
    assert pad.lever == "less padding" and "4.0x" in pad.lever_reason
    dt = place("x", "fp32", 1e10, 1e8, 0.125, 100.0, 20.0, context=LeverContext(better_dtype="int8", better_gain=1.8))
    assert dt.lever == "precision" and "int8" in dt.lever_reason
    slow = place("x", "fp32", 1e10, 1e8, 1.0, 100.0, 20.0)  # 10% of the roof
    assert slow.lever == "fusion"
    with pytest.raises(ValueError):
        place("x", "fp32", 0.0, 1e8, 1.0, 100.0, 20.0)


def test_a_share_above_the_roof_is_a_measurement_error_not_a_figure() -> None:
    # 1 GFLOP in 10 ms = 100 GFLOP/s: at a 100 GFLOP/s roof that is 100%, within the 5% tolerance at 97 ...
    ok = place("x", "fp32", 1e9, 1e7, 0.010, 97.0, 20.0)
    assert ok.pct_of_attainable == pytest.approx(100 / 97) and ok.valid and ok.share_text() == "103%"
    # ... and at a 29.07 GFLOP/s roof it is 344%: no run can do that, so it is flagged, never shown as 344%
    bad = place("x", "fp32", 1e9, 1e7, 0.010, 100 / 3.44, 20.0)
    assert bad.pct_of_attainable == pytest.approx(3.44) and not bad.valid
    assert "344%" not in bad.share_text() and "3.44x" in bad.share_text() and "measurement error" in bad.share_text()
    assert bad.lever == "none" and "above the roof" in bad.lever_reason
    assert rmodel.RooflinePoint.from_dict(bad.to_dict()) == bad and bad.to_dict()["valid"] is False
    assert rmodel.share_text(rmodel.MAX_SHARE) == "105%" and "invalid" in rmodel.share_text(rmodel.MAX_SHARE + 0.01)

    from latencylab.roofline.api import point_finding

    f = point_finding(bad)
    assert "measurement error" in f.title and "%" not in f.title and f.severity == "warning"
    share = next(e for e in f.evidence if e.label == "share of attainable")
    assert isinstance(share.value, str) and "344%" not in share.value
    assert not any(e.label == "share of theoretical peak" for e in f.evidence)
    good = point_finding(place("x", "fp32", 1e10, 1e8, 0.125, 100.0, 20.0))
    assert "= 80% of the attainable 100.0" in good.title


def test_variant_dtype_from_params_and_names() -> None:
    from latencylab.roofline.api import variant_dtype

    assert variant_dtype({"name": "torch-fp32", "params": {"dtype": "float32"}}) == "fp32"
    assert variant_dtype({"name": "torch-bf16", "params": {"dtype": "bfloat16"}}) == "bf16"
    assert variant_dtype({"name": "torch-int8-dynamic", "params": {"dtype": "qint8"}}) == "int8"
    assert variant_dtype({"name": "ort-int8-static-minmax", "params": {"quantization": {"mode": "static"}}}) == "int8"
    assert variant_dtype({"name": "ort-fp32", "params": {"quantization": None}}) == "fp32"
    assert variant_dtype({"name": "torch-prune-magnitude-50", "params": {"method": "magnitude"}}) == "fp32"


# ------------------------------------------------------------------------------------------ FLOPs and bytes

torch = pytest.importorskip("torch")


def test_flops_and_bytes_of_linear_layers_match_the_hand_count() -> None:
    from latencylab.roofline.flops import count_work

    m, k, h, n = 4, 16, 32, 8
    model = torch.nn.Sequential(torch.nn.Linear(k, h), torch.nn.ReLU(), torch.nn.Linear(h, n))
    w = count_work(model, [torch.randn(m, k)])
    assert w.flops == 2 * m * h * k + 2 * m * n * h  # 2 M N K per Linear
    assert w.linear_weight_elems == k * h + h * n
    assert w.other_weight_elems == h + n  # biases
    # x read, h written (addmm); h read + written (relu); h read, y written (addmm)
    assert w.activation_elems == m * k + m * h + 2 * m * h + m * h + m * n
    assert w.bytes("fp32") == 4 * (k * h + h * n + h + n + w.activation_elems)
    assert w.bytes("bf16") == w.bytes("fp32") / 2
    assert w.bytes("int8") == (k * h + h * n) + 4 * (h + n + w.activation_elems)


def test_embedding_reads_only_the_rows_it_gathers() -> None:
    from latencylab.roofline.flops import count_traffic

    emb = torch.nn.Embedding(1000, 8)
    lin, other, act = count_traffic(emb, [torch.tensor([[1, 2, 3]])])
    assert (lin, other) == (0, 3 * 8)
    assert act == 3 + 3 * 8  # indices read, rows written


# ------------------------------------------------------------------------------------------ measured peaks


@pytest.fixture(scope="module")
def peaks(tmp_path_factory: pytest.TempPathFactory) -> object:
    from latencylab.roofline import peaks as rpeaks

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LATENCYLAB_CACHE", str(tmp_path_factory.mktemp("roofline-cache")))
        return rpeaks.load_or_measure(quick=True, threads=[1])


def test_measured_peaks_are_positive_and_below_theory(peaks: object) -> None:
    from latencylab.roofline.api import theory_for
    from latencylab.roofline.peaks import Peaks

    assert isinstance(peaks, Peaks)
    _, theory = theory_for(peaks)
    fp32 = peaks.compute_gflops("fp32", 1)
    assert fp32 is not None and fp32 > 0
    th = theory["fp32"].gflops(1)
    if th is not None:  # measured cannot beat the ISA x clock peak (10% slack for the clock estimate)
        assert fp32 < 1.1 * th, (fp32, th, peaks.clock_ghz)
    int8 = peaks.compute_gflops("int8", 1)
    th8 = theory["int8"].gflops(1)
    if int8 is not None and th8 is not None:
        assert 0 < int8 < 1.1 * th8
    for c in peaks.compute:  # every method either measured a rate or says why not
        assert (c.gflops is not None and c.gflops > 0) or c.note.startswith("unsupported")
    bw = peaks.bandwidth_gbs(1)
    assert bw is not None and 0.1 < bw < 10_000
    if peaks.clock_ghz is not None:
        assert 0.3 < peaks.clock_ghz < 7.0


def test_peaks_cache_round_trips(peaks: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from latencylab.roofline import peaks as rpeaks

    assert isinstance(peaks, rpeaks.Peaks)
    assert rpeaks.Peaks.from_dict(json.loads(json.dumps(peaks.to_dict()))) == peaks
    monkeypatch.setenv("LATENCYLAB_CACHE", str(tmp_path))
    path = rpeaks.cache_path(peaks.key, quick=True)
    assert path.parent == tmp_path / "roofline"
    rpeaks.save(peaks, path)

    def no_measuring(**_: object) -> None:
        raise AssertionError("measured although the cache holds this machine's peaks")

    monkeypatch.setattr(rpeaks, "measure_peaks", no_measuring)
    assert rpeaks.load_or_measure(quick=True, threads=[1]) == peaks
    path.write_text("{not json")  # an unreadable cache is re-measured, never trusted
    monkeypatch.setattr(rpeaks, "measure_peaks", lambda **_: peaks)
    assert rpeaks.load_or_measure(quick=True, threads=[1]) == peaks
    assert rpeaks.Peaks.from_dict(json.loads(path.read_text())) == peaks  # and rewritten
    stale = {**peaks.to_dict(), "key": "0" * 16}
    path.write_text(json.dumps(stale))  # another machine's record (same file name): re-measured
    calls: list[int] = []
    monkeypatch.setattr(rpeaks, "measure_peaks", lambda **_: calls.append(1) or peaks)
    rpeaks.load_or_measure(quick=True, threads=[1])
    assert calls == [1]


# ------------------------------------------------------------------------------------------ findings


def test_roofline_findings_on_the_vision_workload(peaks: object) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("PIL")
    from latencylab.roofline.api import PEAKS_RULE, RULE, roofline_findings
    from latencylab.roofline.peaks import Peaks

    assert isinstance(peaks, Peaks)
    findings = roofline_findings("vision", 1, peaks=peaks, quick=True)
    points = [f for f in findings if f.rule == RULE]
    assert [f.details["point"]["dtype"] for f in points] == ["fp32", "bf16", "int8"]
    for f in points:
        p = f.details["point"]
        assert p["achieved_gflops"] > 0 and p["seconds"] > 0
        assert p["flops"] == f.details["work"]["flops"] > 5e6  # the digits CNN: ~5.6 MFLOP per image
        assert p["attainable_gflops"] == pytest.approx(min(p["peak_gflops"], p["bandwidth_gbs"] * p["intensity"]))
        assert p["bound"] in ("compute", "memory") and p["lever"] in rmodel.LEVERS
    assert sum(f.rule == PEAKS_RULE for f in findings) == 1


@pytest.mark.slow
def test_vision_work_counted_on_the_input_shape_equals_the_held_out_images() -> None:
    """The report counts a CNN's work on zeros of its input shape (decoding the held-out JPEGs took ~3 s of every
    report): the FLOPs and bytes are those of the real first held-out batch, to the element."""
    pytest.importorskip("sklearn")
    import torch

    from latencylab.optimize.adapters import adapter_for
    from latencylab.roofline.flops import count_work, workload_work

    for batch in (1, 4):
        adapter = adapter_for("vision", batch_size=batch)
        feed = adapter.heldout()[0]
        real = count_work(adapter.torch_model(), [torch.from_numpy(feed["pixels"])])
        assert adapter.shape_feed()["pixels"].shape == feed["pixels"].shape
        assert workload_work("vision", batch_size=batch, adapter=adapter) == real
        assert real.flops > 5e6 * batch


def test_place_optimize_result_and_rule(peaks: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from latencylab.diagnose.rules import roofline as rule_mod
    from latencylab.roofline import api
    from latencylab.roofline.flops import Work
    from latencylab.roofline.peaks import Peaks

    assert isinstance(peaks, Peaks)
    doc = {
        "kind": "optimize",
        "config": {"workload": "text", "threads": 1},
        "model": {"seq_len": 128, "batch_size": 1},
        "candidates": [
            {"name": "torch-fp32", "params": {"dtype": "float32"}, "p50_ms": 40.0},
            {"name": "torch-bf16", "params": {"dtype": "bfloat16"}, "p50_ms": None, "status": "skipped"},
            {"name": "ort-int8-dynamic-default", "params": {"quantization": {"mode": "dynamic"}}, "p50_ms": 14.0},
        ],
    }
    work = Work(flops=2.87e9, linear_weight_elems=10_764_288, other_weight_elems=179_328, activation_elems=25_713_551)
    points = api.place_optimize_result(doc, peaks=peaks, work=work)
    assert [(p.name, p.dtype) for p in points] == [("torch-fp32", "fp32"), ("ort-int8-dynamic-default", "int8")]
    assert points[0].achieved_gflops == pytest.approx(2.87e9 / 0.040 / 1e9)
    assert points[1].bytes < points[0].bytes  # INT8 weights: 1 byte each

    original = api.place_optimize_result  # the rule measures nothing here: our peaks and work
    monkeypatch.setattr(api, "place_optimize_result", lambda d: original(d, peaks=peaks, work=work))
    found = rule_mod.rule([LoadedResult("opt.json", "optimize", doc), LoadedResult("p.json", "profile", {})])
    assert len(found) == 1 and found[0].rule == "roofline" and len(found[0].evidence) == 2
    assert found[0].details["points"][0]["name"] == "torch-fp32"
    onnx = {**doc, "config": {"workload": "onnx:model.onnx"}}
    assert rule_mod.rule([LoadedResult("o.json", "optimize", onnx)]) == []


# ------------------------------------------------------------------------------------------ work each variant did


def _fake_peaks() -> Any:
    from latencylab.roofline.peaks import BandwidthPeak, ComputePeak, Peaks

    compute = (ComputePeak("fp32", 1, "matmul", 100.0), ComputePeak("int8", 1, "ort.MatMulInteger", 200.0))
    return Peaks("k", {}, compute, (BandwidthPeak(1, "triad", 20.0, 128),), None, "2026-01-01T00:00:00", 0.0)


def _fake_work_at(calls: list[tuple[int, int]]) -> Any:
    """A transformer-like count: linear in the positions plus an attention term in the length squared."""
    from latencylab.roofline.flops import Work

    def at(batch: int, seq: int) -> Work:
        calls.append((batch, seq))
        return Work(batch * (2e7 * seq + 4e4 * seq * seq), 1_000_000, 1_000 * batch * seq, 50_000 * batch * seq)

    return at


LENS = [12, 20, 20, 36]  # natural lengths of the primary set's calls: 22 positions per call on average


def _text_doc(with_stats: bool = True) -> dict[str, Any]:
    padded = {"tokens_per_call": 128.0, "seq_lens": [128] * len(LENS)}
    exact = {"tokens_per_call": sum(LENS) / len(LENS), "seq_lens": LENS}
    cands: list[dict[str, Any]] = [
        {"name": "torch-fp32", "params": {"dtype": "float32"}, "p50_ms": 40.0, "stats": padded},
        {"name": "torch-fp32-exact", "params": {"dtype": "float32"}, "p50_ms": 8.0, "stats": exact},
        {"name": "ort-int8-dynamic-exact", "params": {"quantization": {"mode": "dynamic"}}, "p50_ms": 5.0,
         "stats": exact},
        {"name": "torch-bf16", "params": {"dtype": "bfloat16"}, "p50_ms": None, "status": "skipped"},
    ]  # fmt: skip
    if not with_stats:
        for c in cands:
            c.pop("stats", None)
    return {
        "kind": "optimize",
        "config": {"workload": "text", "threads": 1},
        "model": {"seq_len": 128, "batch_size": 1, "padding": "max_length"},
        "summary": {"chosen": {"name": "ort-int8-dynamic-exact"}},
        "candidates": cands,
    }


def test_each_variant_is_credited_with_the_work_it_did() -> None:
    from latencylab.roofline import api
    from latencylab.roofline.peaks import Peaks

    peaks = _fake_peaks()
    assert isinstance(peaks, Peaks)
    calls: list[tuple[int, int]] = []
    at = _fake_work_at(calls)
    points = {p.name: p for p in api.place_optimize_result(_text_doc(), peaks=peaks, work_at=at)}
    assert set(points) == {"torch-fp32", "torch-fp32-exact", "ort-int8-dynamic-exact"}
    flops = {n: 2e7 * n + 4e4 * n * n for n in {22, 128, *LENS}}
    assert points["torch-fp32"].flops == pytest.approx(flops[128])  # the padded variant ran every position
    # the exact-shape variant: the work of its median-length call (20: the call its p50 time belongs to), not
    # the mean work (long inputs pull it up, the p50 time does not move) and not the 128 padded positions
    exact = flops[sorted(LENS)[(len(LENS) - 1) // 2]]
    assert points["torch-fp32-exact"].flops == pytest.approx(exact)
    assert exact != pytest.approx(sum(flops[n] for n in LENS) / len(LENS)) and exact < flops[128] / 5
    assert points["torch-fp32-exact"].achieved_gflops == pytest.approx(exact / 0.008 / 1e9)
    assert sorted(calls) == [(1, n) for n in sorted({128, *LENS})]  # each distinct shape counted once
    # credited with real work the exact variants stay under their roofs; the padded one is told to trim
    assert all(p.valid for p in points.values()), [(p.name, p.pct_of_attainable) for p in points.values()]
    assert (
        points["torch-fp32"].lever == "less padding"
        and "83% of the input positions" in points["torch-fp32"].lever_reason
    )
    assert points["torch-fp32-exact"].lever != "less padding"
    # batch 4 x natural lengths: the batch is tokens per call / mean length
    doc4 = _text_doc()
    doc4["candidates"] = [{**c, "stats": {"tokens_per_call": 88.0, "seq_lens": LENS}} for c in doc4["candidates"][1:2]]
    calls.clear()
    api.place_optimize_result(doc4, peaks=peaks, work_at=at)
    assert sorted(set(calls)) == [(4, n) for n in sorted(set(LENS))]


def test_old_documents_fall_back_and_an_over_the_roof_credit_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    from latencylab.diagnose.rules import roofline as rule_mod
    from latencylab.report.html import ReportInput, render_report
    from latencylab.roofline import api
    from latencylab.roofline.peaks import Peaks

    peaks = _fake_peaks()
    assert isinstance(peaks, Peaks)
    at = _fake_work_at([])
    padded = at(1, 128)
    old = _text_doc(with_stats=False)
    counted: list[tuple[str, int, object]] = []

    def counting(w: str, b: int, s: object) -> Any:
        counted.append((w, b, s))
        return padded

    monkeypatch.setattr(api, "workload_work", counting)
    points = {p.name: p for p in api.place_optimize_result(old, peaks=peaks, work_at=at)}
    assert counted == [("text", 1, 128)]  # no stats: the document's shape for every variant, as before
    assert {p.flops for p in points.values()} == {padded.flops}
    # 128 padded positions credited to a variant that ran ~22: the int8 one "achieves" 3.2 TOP/s of a 200 roof
    bad = points["ort-int8-dynamic-exact"]
    assert bad.pct_of_attainable > 3 and not bad.valid
    monkeypatch.setattr(api, "place_optimize_result", lambda d: list(points.values()))
    (f,) = rule_mod.rule([LoadedResult("optimize-text.json", "optimize", old)])
    assert f.severity == "warning" and "measurement error" in f.title
    assert re.search(r"\d{3,}%", f.title) is None, f.title  # never "1612% of its attainable"
    assert "chosen ort-int8-dynamic-exact measures above its roof" in f.title
    assert "2 of 3 variants above their roof" in f.title  # torch-fp32-exact too (5x the work it did)
    values = [e.value for e in f.evidence]
    assert isinstance(values[0], float) and all(isinstance(v, str) and "measurement error" in v for v in values[1:])
    body = render_report(ReportInput(results=(), findings=(f,))).split("<body>", 1)[1]
    assert "measurement error" in body and re.search(r"\d{3,}%", body) is None
    # the same document with the work each variant did: every share is a valid figure again
    monkeypatch.undo()
    good = api.place_optimize_result(_text_doc(), peaks=peaks, work_at=at)
    monkeypatch.setattr(api, "place_optimize_result", lambda d: good)
    (g,) = rule_mod.rule([LoadedResult("optimize-text.json", "optimize", _text_doc())])
    assert "measurement error" not in g.title and re.search(r"= \d{1,3}% of its attainable", g.title), g.title
    assert g.title.startswith("text optimize variants on the roofline: chosen ort-int8-dynamic-exact at ")


def test_many_lengths_take_five_counts_when_the_work_is_quadratic_in_the_length() -> None:
    from latencylab.roofline.flops import Work, works_at_lengths

    lens = list(range(5, 251, 7))  # 36 distinct lengths
    calls: list[tuple[int, int]] = []
    quad = _fake_work_at(calls)
    got = works_at_lengths(quad, 2, lens)
    assert len(calls) == 5 and set(got) == set(lens)  # 3 to fit, 2 to check the fit
    for n in lens:
        exact = quad(2, n)
        assert (got[n].flops, got[n].activation_elems, got[n].other_weight_elems) == (
            exact.flops, exact.activation_elems, exact.other_weight_elems
        )  # fmt: skip

    def branchy(batch: int, seq: int) -> Work:  # not one polynomial: a different path above 100 positions
        calls.append((batch, seq))
        return Work(1e6 * seq * (3 if seq > 100 else 1), 10, 10 * seq, 100 * seq)

    calls.clear()
    got = works_at_lengths(branchy, 1, lens)
    assert sorted(calls) == [(1, n) for n in lens]  # the check failed: every length counted
    assert got[250].flops == 3 * 250e6 and got[54].flops == 54e6
    calls.clear()
    assert set(works_at_lengths(quad, 1, [8, 16, 32])) == {8, 16, 32} and len(calls) == 3  # few: each counted


def test_shape_counter_counts_the_text_model_once_per_length() -> None:
    pytest.importorskip("transformers")
    from latencylab.roofline import api

    try:
        at = api.shape_counter("text")
        w16, w32 = at(1, 16), at(1, 32)
    except OSError as exc:  # the model is not in the local cache (offline)
        pytest.skip(f"MiniLM not available: {exc}")
    assert at(1, 16) is w16  # cached: counted once
    # 6 layers x (4 projections of 384 x 384, 2 of 384 x 1536) = 21.2M MACs per token, plus attention's
    # 2 x 6 x L x L x 384 MACs: twice the tokens is more than twice the work
    per_token = 6 * (4 * 384 * 384 + 2 * 384 * 1536) * 2
    assert w16.flops == pytest.approx(16 * per_token + 2 * 6 * 16 * 16 * 384 * 2, rel=0.02)
    assert 2 * w16.flops < w32.flops < 2.1 * w16.flops
    assert w16.linear_weight_elems == w32.linear_weight_elems  # the same weights read at any length
    # MiniLM's counts are quadratic in the length: of seven lengths, five are counted (three to fit, two to
    # check) and 16 and 32 interpolated, equal to their direct counts above
    from latencylab.roofline.flops import works_at_lengths

    counted: list[int] = []

    def counting(batch: int, seq: int) -> Any:
        counted.append(seq)
        return at(batch, seq)

    got = works_at_lengths(counting, 1, [5, 9, 16, 24, 32, 40, 64])
    assert sorted(counted) == [5, 9, 24, 40, 64]
    for direct, n in ((w16, 16), (w32, 32)):
        assert (got[n].flops, got[n].linear_weight_elems, got[n].other_weight_elems, got[n].activation_elems) == (
            direct.flops, direct.linear_weight_elems, direct.other_weight_elems, direct.activation_elems
        )  # fmt: skip

"""``latencylab report`` end to end: real profile, load and optimize runs -> one HTML file -> headless Chromium.

The inputs come from real short runs (a synthetic profile with an injected stall, an open-loop load run
against the reference server, an optimize search on the vision model) and the real SLO guard driven
through a slowdown on a fake clock (the serve-ladder result). The screenshot's pixels must show the plots.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.errors import LatencyLabError
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult
from servers import reference_server

pytest.importorskip("matplotlib")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "latencylab", *args], capture_output=True, text=True, timeout=timeout)


def _ladder_doc() -> dict[str, Any]:
    """The real SloGuard on a fake clock: 50 req/s for 30 s, fp32 slowed to 120 ms from 4 s to 14 s, the
    lighter rung too from 8 s to 14 s; sampled every 100 ms like benchmarks/serve_ladder.py does."""
    from latencylab.clock import FakeClock
    from latencylab.serve.guard import GuardConfig, SloGuard

    ladder = ["fp32", "res32", "int8", "cache"]
    clock = FakeClock()
    cfg = GuardConfig(slo_ms=50.0, window_s=4.0, bucket_s=0.5, dwell_s=2.5, min_samples=20, probe_fraction=0.1,
                      probe_min_samples=10)  # fmt: skip
    guard = SloGuard(ladder, cfg, clock)
    rng = np.random.default_rng(0)
    samples, per_s, lat_s = [], [], []
    for i in range(30 * 50):
        t = i / 50
        clock.now_ns = round(t * 1e9)
        level = guard.route()
        slow = (level == 0 and 4 <= t < 14) or (level == 1 and 8 <= t < 14)
        lat_ms = (120.0 if slow else 3.0) * float(rng.lognormal(0, 0.2))
        guard.observe(level, lat_ms * 1e6)
        guard.first_served(level)
        lat_s.append(lat_ms)
        if i % 5 == 0:
            guard.evaluate()
            samples.append([t, guard.level, guard.window_quantile(guard.level), guard.alarm_active])
        if i % 50 == 49:
            per_s.append({"from_s": t - 0.98, "to_s": t + 0.02, "p99_ms": float(np.quantile(lat_s, 0.99))})
            lat_s = []
    trans = [{**tr.to_dict(), "t_s": tr.at_s} for tr in guard.transitions]
    assert any(tr["direction"] == "down" for tr in trans) and any(tr["direction"] == "up" for tr in trans)
    return {
        "schema_version": 1, "kind": "serve", "created_at": "2026-01-01T00:00:00+00:00", "ladder": ladder,
        "model": "vision", "slo_ms": 50.0, "rate": 50.0, "duration_s": 30.0, "guard": {},
        "phases": [{"at_s": 0.0, "slow": []}, {"at_s": 4.0, "slow": ["fp32"]}, {"at_s": 8.0, "slow": ["fp32", "res32"]},
                   {"at_s": 14.0, "slow": []}],
        "transitions": trans, "samples": samples, "client_per_second": per_s, "client_shift_s": 0.0,
    }  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report-inputs")
    out = {k: d / f"{k}.json" for k in ("profile", "load", "load2", "optimize", "serve")}
    p = _cli("profile", "--workload", "synthetic", "--iterations", "600", "--warmup", "2", "--quiet",
             "--param", "stages=decode:constant(200us);forward:lognormal(1ms,0.2);post:constant(50us)",
             "--param", "stall=forward@400:15ms", "--param", "timer=fake",
             "--json", str(out["profile"]))  # fmt: skip
    assert p.returncode == 0, p.stderr
    with reference_server("--service", "lognormal(4ms,0.3)") as url:
        for key, rate, secs in (("load", "40", "3"), ("load2", "120", "2")):  # two points against throughput
            p = _cli("load", "--url", url, "--model", "reference", "--rate", rate, "--duration", secs, "--slo",
                     "p99=50ms", "--quiet", "--json", str(out[key]))  # fmt: skip
            assert p.returncode == 0, p.stderr
    p = _cli("optimize", "--workload", "vision", "--families", "torch,onnxruntime", "--only", "ort-fp32",
             "--rounds", "2", "--quiet", "--json", str(out["optimize"]))  # fmt: skip
    assert p.returncode == 0, p.stderr
    out["serve"].write_text(json.dumps(_ladder_doc()))
    # forward: lognormal(1 ms, 0.2) has p99 1.59 ms (on the FakeClock: exactly the drawn durations): 1.6x its 1 ms
    (d / "budget.toml").write_text("deadline_ms = 8\nquantile = 'p99'\n[stages]\ndecode = 5\nforward = 1\npost = 5\n")
    out["budget"] = d / "budget.toml"
    return out


@pytest.fixture(scope="module")
def report(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    html_path = tmp_path_factory.mktemp("report") / "report.html"
    files = [str(inputs[k]) for k in ("profile", "load", "load2", "optimize", "serve")]
    p = _cli("report", *files, "-o", str(html_path), "--latency-budget", str(inputs["budget"]), "--title", "T <test>")
    assert p.returncode == 0, p.stderr
    assert f"wrote {html_path}" in p.stdout
    return html_path, p.stdout


RESOURCE = re.compile(
    r"""(?:\b(?:src|href|action|poster|data)\s*=\s*["']?\s*|url\(\s*["']?|@import\s+["']?)(https?:|//)""", re.I
)


def test_html_is_self_contained_with_every_section(report: tuple[Path, str]) -> None:
    path, _ = report
    text = path.read_text()
    assert not RESOURCE.search(text), RESOURCE.search(text)
    assert "<script" not in text.lower() and "<link" not in text.lower()
    srcs = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(srcs) >= 10 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "figure not drawn" not in text
    assert "<title>T &lt;test&gt;</title>" in text  # escaped, never raw
    for section in ("Inputs at a glance", "Findings", "Latency budget", "Latency distribution", "Stage breakdown",
                    "Latency over time", "Latency vs throughput", "Optimisation: latency vs fidelity",
                    "SLO guard ladder"):  # fmt: skip
        assert f"<h2>{section}</h2>" in text, section
    assert path.stat().st_size < 1_500_000


def test_budget_marks_the_breaking_stage(report: tuple[Path, str]) -> None:
    text = report[0].read_text()
    # forward: lognormal(1 ms, 0.2) plus a 15 ms stall: its p99 is over 1 ms; decode (0.2 ms) is within 5 ms.
    row = re.search(r'<tr class="breaks">(.*?)</tr>', text)
    assert row is not None and "<td>forward</td>" in row.group(1) and "breaks the budget first" in row.group(1)
    assert "BUDGET BROKEN" in text and "breaks first: forward" in text
    assert re.search(r"<tr><td>decode</td>.*?within", text)


def test_optimize_and_findings_sections(report: tuple[Path, str], inputs: dict[str, Path]) -> None:
    text = report[0].read_text()
    doc = json.loads(inputs["optimize"].read_text())
    chosen = (doc["summary"]["chosen"] or {}).get("name")
    if chosen:
        assert f"{chosen} &#9733; chosen" in text
    findings = text.split("<h2>Findings</h2>", 1)[1].split("</section>", 1)[0]
    # whatever state diagnose is in, the section says so: findings, nothing found, unavailable or failed
    assert re.search(r'class="finding |found nothing|diagnose unavailable|diagnose failed', findings), findings


def _screenshot(html_path: Path, tmp: Path, height: int) -> np.ndarray:
    from PIL import Image

    tmp.mkdir(parents=True, exist_ok=True)
    shot = tmp / "shot.png"
    cmd = [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'profile'}",
           f"--screenshot={shot}", f"--window-size=1400,{height}", html_path.resolve().as_uri()]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert shot.is_file(), p.stderr[-2000:]
    return np.asarray(Image.open(shot).convert("RGB"))


def _has_colour(img: np.ndarray, hex_colour: str, tol: int = 18, min_pixels: int = 40) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(img.astype(int) - rgb).max(axis=2) <= tol).sum()) >= min_pixels


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (scripts/system-deps.sh)")
def test_chromium_screenshot_shows_the_plots(report: tuple[Path, str], inputs: dict[str, Path], tmp_path: Path) -> None:
    # The first screen of the full report, as a reader opens it (1400 x 4000): budget table and the first plots.
    img = _screenshot(report[0], tmp_path / "full", 4000)
    assert img.shape[:2] == (4000, 1400)
    assert img.std() > 20  # not a blank or near-uniform page
    assert _has_colour(img, "#fdecea", tol=4, min_pixels=2000)  # the budget's "over" rows
    # The optimize and serve results alone: the Pareto front and the ladder fit on one screen.
    small = tmp_path / "small.html"
    p = _cli("report", str(inputs["optimize"]), str(inputs["serve"]), "-o", str(small))
    assert p.returncode == 0, p.stderr
    img2 = _screenshot(small, tmp_path / "small", 4000)
    both = np.concatenate([img, img2])
    # many bands of the pages carry plots: hundreds of distinct colours (anti-aliased lines, fills, text)
    # (a colour as one 24-bit integer: np.unique over rows of 3 took ~10 s for the two pages)
    packed = both.astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)
    rich = [len(np.unique(packed[y : y + 500])) for y in range(0, packed.shape[0], 500)]
    assert sum(n >= 150 for n in rich) >= 8, rich
    # the plots' own colours: stage fill, p50 blue, p99 orange, deadline/SLO red
    for colour in ("#4c78a8", "#1f77b4", "#ff7f0e", "#d62728"):
        assert _has_colour(img, colour), colour
    # ... and on the second page: the ladder's green step line and the chosen variant's green star
    for colour in ("#1b7837", "#2ca02c", "#ff7f0e"):
        assert _has_colour(img2, colour), colour


def test_bad_inputs_are_one_line_errors(tmp_path: Path, inputs: dict[str, Path]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"kind": "weather", "schema_version": 1}))
    for args, message in (
        ([str(tmp_path / "missing.json")], "no such result file"),
        ([str(bad)], "not a JSON result file (JSONDecodeError)"),
        (
            [str(odd)],
            "unknown result kind 'weather'; the report reads profile, load, capacity, optimize, optimize-gen, serve",
        ),
        ([str(inputs["profile"]), "--latency-budget", str(tmp_path / "nope.toml")], "no such budget file"),
    ):
        p = _cli("report", *args, "-o", str(tmp_path / "r.html"))
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_findings_render_with_evidence_and_time_ranges() -> None:
    from latencylab.report.html import ReportInput, render_report

    f = Finding(
        rule="preprocess-dominates", severity="critical", title="preprocessing is 61% of end-to-end time",
        evidence=(Evidence("preprocess share", 61.0, "%"), Evidence("stall", 15.2, "ms", 3.0, 3.5)),
        recommendation="move decoding <off> the request path", source="/x/vision.json",
    )  # fmt: skip
    serve = LoadedResult("ladder.json", "serve", _ladder_doc())
    text = render_report(ReportInput(results=(serve,), findings=(f,)))
    assert '<div class="finding critical">' in text and "preprocessing is 61% of end-to-end time" in text
    assert "move decoding &lt;off&gt; the request path" in text and "3.0-3.5 s" in text
    assert "(vision.json, rule preprocess-dominates)" in text
    text = render_report(ReportInput(results=(serve,), findings=None, findings_note="diagnose unavailable: x"))
    assert "diagnose unavailable: x" in text and "Latency budget" not in text


def test_load_input_checks_kind_and_keys(tmp_path: Path) -> None:
    from latencylab.report.frontend import load_input

    p = tmp_path / "o.json"
    p.write_text(json.dumps({"kind": "optimize", "schema_version": 1, "summary": {}}))
    with pytest.raises(LatencyLabError, match="malformed optimize result: missing candidates"):
        load_input(p)
    p.write_text(json.dumps({"kind": "profile", "schema_version": 7, "stages": [], "iteration_start_ns": []}))
    with pytest.raises(LatencyLabError, match="schema_version 7"):
        load_input(p)


# ------------------------------------------------------------------------------------------ optimize: 46 candidates


def optimize_doc(split: bool = True) -> dict[str, Any]:
    """A realistic text optimize result (46 candidates: torch, ONNX Runtime, OpenVINO; p50 3-40 ms, cos
    0.85-1.0), its Pareto front computed by the search's own function, the speed-up split in the summary."""
    from latencylab.optimize.search import pareto_front

    rng = np.random.default_rng(7)
    specs: list[tuple[str, str, float, float]] = [  # name, backend, p50 ms, 1 - cos
        ("torch-fp32", "torch", 38.0, 0.0), ("torch-bf16", "torch", 39.5, 2e-4), ("torch-compile", "torch", 30.0, 1e-7),
        ("torch-int8-dynamic", "torch", 21.0, 4e-3), ("torch-prune-magnitude-30", "torch", 33.0, 0.04),
        ("torch-prune-magnitude-50", "torch", 29.0, 0.15), ("ort-fp32", "onnxruntime", 24.0, 2e-7),
        ("ort-fp32-opt-all", "onnxruntime", 20.0, 3e-7), ("ov-fp32", "openvino", 19.0, 4e-7),
        ("ov-int8-nncf-mixed", "openvino", 9.5, 6e-3), ("ov-int8-nncf-performance", "openvino", 8.2, 0.018),
    ]  # fmt: skip
    for mode in ("default", "perchannel", "reduce-range"):
        specs.append(
            (f"ort-int8-dynamic-{mode}", "onnxruntime", 13.0 + rng.uniform(-1.5, 1.5), 10 ** rng.uniform(-3, -2.3))
        )
    for k in range(1, 5):
        specs.append(
            (f"ort-int8-dynamic-perchannel-fallback-k{k}", "onnxruntime", 13.5 + k * 0.9, 10 ** (-2.5 - 0.3 * k))
        )
    for method in ("minmax", "entropy", "percentile"):
        for pc in ("", "-perchannel"):
            specs.append(
                (
                    f"ort-int8-static-{method}{pc}",
                    "onnxruntime",
                    10.5 + rng.uniform(-1, 1),
                    10 ** rng.uniform(-2.2, -1.2),
                )
            )
    for b in (4, 8, 16):
        specs.append((f"ort-fp16-blocks-{b}", "onnxruntime", 26.0 + rng.uniform(-2, 2), 10 ** rng.uniform(-5, -4)))
    base = list(specs)
    for name, backend, p50, loss in base:  # shape policy "exact": the same model on the real tokens only
        if len(specs) < 45 and name != "torch-fp32":
            specs.append((f"{name}-exact", backend, p50 * 0.22 + rng.uniform(0.2, 0.6), loss * rng.uniform(0.8, 1.3)))
    specs.append(("torch-fp32-exact", "torch", 9.0, 0.0))
    assert len(specs) == 46, len(specs)
    cands = []
    for name, backend, p50, loss in specs:
        cos = 1.0 - loss
        inside = cos >= 0.99 and cos - 3 * loss >= 0.98
        status = "baseline" if name == "torch-fp32" else ("inside-budget" if inside else "outside-budget")
        cands.append({
            "name": name, "backend": backend, "status": status, "params": {},
            "reason": "inside budget" if inside else f"cos {cos:.4f} < 0.99",
            "fidelity": {"n": 64, "cos_mean": cos, "cos_min": cos - 3 * loss, "max_abs": loss, "top1": 1.0,
                         "accuracy": None, "reference_accuracy": None},
            "p50_ms": p50, "p50_ci_ms": [p50 * 0.97, p50 * 1.04], "p99_ms": p50 * 1.3, "speedup_p50": 38.0 / p50,
        })  # fmt: skip
    cands.append({"name": "tvm-fp32", "backend": "tvm", "status": "skipped", "reason": "tvm is not installed",
                  "params": {}, "fidelity": None, "p50_ms": None})  # fmt: skip
    ok = [c for c in cands if c["status"] in ("baseline", "inside-budget")]
    front = pareto_front([(c["name"], c["p50_ms"], c["fidelity"]["cos_mean"]) for c in ok])
    chosen = min((c for c in ok if c["status"] == "inside-budget"), key=lambda c: c["p50_ms"])
    summary: dict[str, Any] = {
        "budget": "cos>=0.99,min_cos>=0.98",
        "verdict": f"chosen {chosen['name']}: {38.0 / chosen['p50_ms']:.2f}x faster than torch-fp32 (p50)",
        "baseline": {"name": "torch-fp32", "p50_ms": 38.0},
        "chosen": {"name": chosen["name"], "p50_ms": chosen["p50_ms"]},
        "pareto": list(front), "speedup_p50": 38.0 / chosen["p50_ms"],
    }  # fmt: skip
    if split:
        summary.update(speedup=3.4, pipeline_speedup=1.6, total_speedup=5.44,
                       speedup_by_set={"sentences": 3.4, "passages128": 2.1},
                       baseline_inputs="torch-fp32 eager, padded to 128 tokens, 1 thread, batch 1")  # fmt: skip
    return {
        "schema_version": 1, "kind": "optimize", "created_at": "2026-01-01T00:00:00+00:00",
        "config": {"workload": "text", "threads": 1},
        "model": {"model": "sentence-transformers/all-MiniLM-L6-v2", "seq_len": 128, "batch_size": 1},
        "summary": summary, "candidates": cands,
    }  # fmt: skip


def test_optimize_plot_names_only_the_front_and_the_choice() -> None:
    from matplotlib.colors import to_hex
    from matplotlib.text import Text

    from latencylab.report import figures

    doc = optimize_doc()
    s = doc["summary"]
    assert len(doc["candidates"]) == 47 and 3 <= len(s["pareto"]) < 15
    fig, named = figures.pareto_figure(doc)
    assert set(named) == set(s["pareto"]) | {s["chosen"]["name"]}
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    names = {c["name"] for c in doc["candidates"]}
    assert sorted(t for t in texts if t in names) == sorted(named)  # no other candidate is named on the plot
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text, without its leader line
    for i, a in enumerate(boxes):  # every name readable: inside the axes, overlapping no other text
        if texts[i] in names:
            assert frame.x0 - 1 <= a.x0 and a.x1 <= frame.x1 + 1 and frame.y0 - 1 <= a.y0 and a.y1 <= frame.y1 + 1
        assert not any(a.overlaps(b) for b in boxes[i + 1 :]), texts[i]
    # fidelity as a loss on a log axis, up = closer to FP32: cos 0.999 stands a decade above cos 0.99
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log" and ax.yaxis_inverted()
    y99, y999 = (ax.transData.transform((10.0, v))[1] for v in (0.01, 0.001))
    assert y999 - y99 > 60
    budget = [ln for ln in ax.lines if list(ln.get_ydata()) == pytest.approx([0.01, 0.01])]
    assert budget and to_hex(budget[0].get_color()) == figures.DEADLINE
    assert any("budget cos>=0.99" in t and "1 - cos <= 0.01" in t for t in texts)
    assert figures.pareto_front(doc).startswith("data:image/png;base64,")


def test_optimize_headline_splits_the_speedup() -> None:
    from latencylab.report.html import ReportInput, render_report

    def section(doc: dict[str, Any]) -> str:
        html = render_report(ReportInput(results=(LoadedResult("opt.json", "optimize", doc),), findings=()))
        return html.split('<section id="optimize">', 1)[1].split("</section>", 1)[0]

    text = section(optimize_doc())
    glance = render_report(ReportInput(results=(LoadedResult("opt.json", "optimize", optimize_doc()),)))
    assert "speed-up 3.40x at equal work x 1.60x pipeline = 5.44x in total" in glance
    assert 'model, at equal work (the baseline&#x27;s inputs)</td><td class="num"><b>3.40x</b>' in text
    assert 'pipeline (a shape policy changed the inputs)</td><td class="num">1.60x' in text
    assert 'total (model x pipeline)</td><td class="num"><b>5.44x</b>' in text
    assert (
        '<i>sentences</i></td><td class="num">3.40x' in text and '<i>passages128</i></td><td class="num">2.10x' in text
    )
    assert "baseline: torch-fp32 eager, padded to 128 tokens, 1 thread, batch 1" in text
    # the table lists every candidate by p50, as the plot's x axis runs; unmeasured ones last
    p50s = [float(m) for m in re.findall(r'<td class="num">([0-9.]+) \[', text)]
    assert len(p50s) == 46 and p50s == sorted(p50s) and text.rindex("tvm-fp32") > text.rindex("torch-bf16")
    assert '<th class="num">1 - cos</th>' in text
    # no shape policy changed the inputs: the pipeline row says so rather than showing a number
    doc = optimize_doc()
    doc["summary"].update(pipeline_speedup=None, total_speedup=3.4)
    assert "none: the inputs as the baseline ran them" in section(doc)
    assert "time cap cut" not in section(doc)
    # candidates the search's time cap cut are named
    doc["summary"]["skipped_by_time_cap"] = ["torch-compile", "ort-int8-static-entropy"]
    assert "time cap cut 2 candidate(s) before they were built: torch-compile, ort-int8-static-entropy" in section(doc)
    # an older result: only speedup_p50, rendered under its own definition, no split rows
    old = optimize_doc(split=False)
    text = section(old)
    assert f'baseline p50 / chosen p50</td><td class="num"><b>{old["summary"]["speedup_p50"]:.2f}x</b>' in text
    assert "pipeline" not in text and "equal work" not in text

"""Assemble the one-file HTML report: inline CSS, figures as ``data:`` URIs, no script, no network.

The document is built from :class:`~latencylab.results.LoadedResult` values (file, kind, parsed
JSON), an optional latency budget and the findings of ``diagnose``. Sections appear only when some input
feeds them, in this order: inputs at a glance, findings, latency budget, latency distribution, stage
breakdown, latency over time, latency vs throughput, optimisation (Pareto front), generative optimisation
(TPOT speed-up vs fidelity), SLO guard ladder.

A figure that cannot be drawn from its input (say, a load run without one successful request) becomes
a one-line note in its place; the rest of the report is still written.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencylab import __version__, stats
from latencylab.budget import Budget, BudgetVerdict, evaluate_budget
from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.findings import SEVERITIES, Finding
from latencylab.load.results import LoadResult
from latencylab.report import figures
from latencylab.results import LoadedResult, ProfileResult
from latencylab.results.base import utc_now
from latencylab.results.optimize_gen import OptimizeGenResult

__all__ = ["ReportInput", "render_report"]

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dde5; --bg:#f6f7f9; --red:#c62828; --amber:#b26a00; --green:#2e7d32; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--fg);
       background:var(--bg); }
main { max-width:1180px; margin:0 auto; padding:24px 28px 60px; background:#fff; }
h1 { font-size:26px; margin:0 0 4px; } h2 { font-size:20px; margin:34px 0 10px; padding-bottom:4px;
     border-bottom:2px solid var(--line); } h3 { font-size:16px; margin:22px 0 8px; }
.meta, .note { color:var(--muted); font-size:13px; }
nav { margin:12px 0 4px; font-size:13px; } nav a { margin-right:14px; color:#1f5fa8; text-decoration:none; }
table { border-collapse:collapse; width:100%; margin:8px 0 14px; font-size:13px; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:#eef1f5; font-weight:600; } td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
tr.over td { background:#fdecea; } tr.breaks td { background:#f9d3cf; font-weight:600; }
tr.total td { font-weight:600; } table.narrow { width:auto; min-width:460px; }
figure { margin:10px 0 18px; } figure img { max-width:100%; height:auto; border:1px solid var(--line); }
figcaption { color:var(--muted); font-size:12.5px; margin-top:4px; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px; font-weight:700; color:#fff; }
.critical { background:var(--red); } .warning { background:var(--amber); } .info { background:#546e7a; }
.ok { color:var(--green); font-weight:700; } .bad { color:var(--red); font-weight:700; }
.finding { border:1px solid var(--line); border-left:5px solid #546e7a; padding:10px 14px; margin:10px 0; }
.finding.critical { border-left-color:var(--red); background:#fff; } .finding.warning { border-left-color:var(--amber);
  background:#fff; } .finding.info { background:#fff; }
.finding h3 { margin:0 0 6px; } .finding .rec { margin:6px 0 0; }
.verdict { font-size:15px; margin:6px 0; padding:8px 12px; border-radius:4px; }
.verdict.ok { background:#e8f5e9; } .verdict.bad { background:#fdecea; }
"""


@dataclass(frozen=True, slots=True)
class ReportInput:
    """Everything one report is made of."""

    results: tuple[LoadedResult, ...]
    title: str = "latencylab report"
    budget: Budget | None = None
    findings: tuple[Finding, ...] | None = None  # None: diagnose did not run (see findings_note)
    findings_note: str = ""
    created_at: str = field(default_factory=utc_now)


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _ms(v: Any, digits: int = 3) -> str:
    if not figures.finite(v):
        return "-"
    return f"{float(v):,.0f}" if abs(float(v)) >= 1000 else f"{float(v):.{digits}g}"


def _label(r: LoadedResult) -> str:
    return Path(r.source).stem or r.source


def _figure(caption: str, draw: Callable[..., str | None], *args: Any) -> str:
    """An <img> of ``draw(*args)``'s data URI with a caption, or a note when the input cannot be drawn."""
    try:
        uri = draw(*args)
    except MissingDependencyError:
        raise
    except (LatencyLabError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f'<p class="note">figure not drawn ({_e(caption)}): {_e(type(exc).__name__)}: {_e(exc)}</p>'
    if uri is None:
        return ""
    return f'<figure><img alt="{_e(caption)}" src="{uri}"><figcaption>{_e(caption)}</figcaption></figure>'


def _table(
    head: Sequence[str], rows: Sequence[Sequence[str]], num: Sequence[int] = (), classes: Sequence[str] = ()
) -> str:
    """Rows are already-escaped HTML cells; ``num`` are right-aligned column indexes."""
    th = "".join(f'<th class="num">{h}</th>' if i in num else f"<th>{h}</th>" for i, h in enumerate(head))
    body = []
    for k, row in enumerate(rows):
        cls = f' class="{classes[k]}"' if k < len(classes) and classes[k] else ""
        tds = "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(row))
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# -- per-kind views ---------------------------------------------------------------------------------


@dataclass
class _Parsed:
    """The inputs sorted by kind, parsed once."""

    profiles: list[tuple[LoadedResult, ProfileResult]] = field(default_factory=list)
    loads: list[tuple[LoadedResult, LoadResult]] = field(default_factory=list)
    capacities: list[LoadedResult] = field(default_factory=list)
    optimizes: list[LoadedResult] = field(default_factory=list)
    gens: list[tuple[LoadedResult, OptimizeGenResult]] = field(default_factory=list)
    serves: list[LoadedResult] = field(default_factory=list)
    verdicts: dict[str, BudgetVerdict] = field(default_factory=dict)  # profile source -> verdict
    budget_errors: dict[str, str] = field(default_factory=dict)


def _parse(inp: ReportInput) -> _Parsed:
    p = _Parsed()
    for r in inp.results:
        if r.kind == "profile":
            pr = ProfileResult.from_dict(r.doc)
            p.profiles.append((r, pr))
            if inp.budget is not None:
                try:
                    p.verdicts[r.source] = evaluate_budget(inp.budget, pr)
                except LatencyLabError as exc:  # e.g. the budget names stages of another workload
                    p.budget_errors[r.source] = str(exc)
        elif r.kind == "load":
            p.loads.append((r, LoadResult.from_dict(r.doc)))
        elif r.kind == "capacity":
            p.capacities.append(r)
        elif r.kind == "optimize":
            p.optimizes.append(r)
        elif r.kind == "optimize-gen":
            p.gens.append((r, OptimizeGenResult.from_dict(r.doc)))
        elif r.kind == "serve":
            p.serves.append(r)
    return p


def _glance(r: LoadedResult) -> str:
    """One line of key figures for the inputs table."""
    d, s = r.doc, r.doc.get("summary") or {}
    if r.kind == "profile":
        e = s.get("end_to_end") or {}
        n = int(e.get("n") or len(d.get("iteration_start_ns") or []))
        return (
            f"{_e(d.get('workload'))}: {n:,} iterations; p50 {_ms(e.get('p50_ms'))} ms, "
            f"p99 {_ms(e.get('p99_ms'))} ms, p99.9 {_ms(e.get('p99_9_ms'))} ms"
        )
    if r.kind == "load":
        t = d.get("target") or {}
        valid = ' <span class="bad">INVALID run</span>' if s.get("valid", True) is False else ""
        if s.get("valid", True) is None:  # closed loop: validity is not judged, the stall may be hidden
            valid = ' <span class="note">closed loop: coordinated omission not corrected</span>'
        return (
            f"{_e(t.get('model', ''))} at {_e(s.get('mode', ''))} loop, {_ms(s.get('achieved_rate'))} req/s achieved; "
            f"{s.get('sent', 0):,} sent / {s.get('ok', 0):,} ok / {s.get('shed', 0):,} shed / {s.get('error', 0):,} "
            f"failed; p50 {_ms(s.get('p50_ms'))} ms, p99 {_ms(s.get('p99_ms'))} ms (uncorrected "
            f"{_ms(s.get('uncorrected_p99_ms'))} ms){valid}"
        )
    if r.kind == "capacity":
        cap = s.get("capacity_rate")
        return f"capacity for {_e(s.get('slo'))}: {_ms(cap)} req/s offered, goodput {_ms(s.get('goodput'))} req/s"
    if r.kind == "optimize":
        split = ""
        if figures.finite(s.get("speedup")):
            split = f"; speed-up {_x(s['speedup'])} at equal work"
            if figures.finite(s.get("pipeline_speedup")) and figures.finite(s.get("total_speedup")):
                split += f" x {_x(s['pipeline_speedup'])} pipeline = {_x(s['total_speedup'])} in total"
        return _e(s.get("verdict", "")) + split
    if r.kind == "optimize-gen":
        n = len(d.get("candidates") or [])
        return _e(s.get("verdict", "")) + f' <span class="note">({n} candidates; budget {_e(s.get("budget"))})</span>'
    if r.kind == "serve":
        trans = d.get("transitions") or []
        return (
            f"{_e(d.get('model', ''))} model at {_e(d.get('rate', '?'))} req/s, SLO p99 <= {_e(d.get('slo_ms'))} ms; "
            f"{len(trans)} ladder transitions"
        )
    return ""


def _inputs_section(inp: ReportInput) -> str:
    rows = [
        [_e(_label(r)), _e(r.kind), _e((r.doc.get("created_at") or "")[:19].replace("T", " ")), _glance(r)]
        for r in inp.results
    ]
    return _table(["result", "kind", "created (UTC)", "at a glance"], rows)


def _findings_section(inp: ReportInput) -> str:
    if inp.findings is None:
        return f'<p class="note">{_e(inp.findings_note or "diagnose unavailable")}</p>'
    if not inp.findings:
        return '<p class="note">diagnose found nothing to report in these results.</p>'
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # critical first
    out = []
    for f in sorted(inp.findings, key=lambda f: order.get(f.severity, 99)):
        ev_rows = []
        for ev in f.evidence:
            value = _ms(ev.value, 4) if figures.finite(ev.value) else _e(ev.value)
            when = ""
            if ev.t_start_s is not None:
                when = f"{ev.t_start_s:.1f}" + ("" if ev.t_end_s is None else f"-{ev.t_end_s:.1f}") + " s"
            ev_rows.append([_e(ev.label), f"{value} {_e(ev.unit)}".strip(), _e(when)])
        if not any(row[2] for row in ev_rows):  # no time ranges: no column for them
            ev_rows = [row[:2] for row in ev_rows]
        head = ["evidence", "value", "when in the run"][: len(ev_rows[0]) if ev_rows else 2]
        evidence = _table(head, ev_rows, num=(1,)) if ev_rows else ""
        source = f' <span class="note">({_e(Path(f.source).name)}, rule {_e(f.rule)})</span>' if f.source else ""
        out.append(
            f'<div class="finding {_e(f.severity)}"><h3><span class="badge {_e(f.severity)}">{_e(f.severity)}</span> '
            f'{_e(f.title)}{source}</h3>{evidence}<p class="rec"><b>What to do:</b> {_e(f.recommendation)}</p></div>'
        )
    counts = ", ".join(f"{sum(f.severity == s for f in inp.findings)} {s}" for s in reversed(SEVERITIES))
    return f'<p class="note">{len(inp.findings)} findings: {counts}.</p>' + "".join(out)


def _budget_section(inp: ReportInput, p: _Parsed) -> str:
    b = inp.budget
    assert b is not None
    q = stats.format_q(b.quantile)
    head = f"<p><b>{_e(b.name or 'budget')}</b>: {q} end-to-end &le; {b.deadline_ms:g} ms"
    if b.origin and b.origin != "deadline_ms":
        head += f" ({_e(b.origin)})"
    head += f"; {len(b.stages or {})} stage allowances, {b.allocated_ms:g} ms allocated.</p>"
    out = [head]
    if not p.profiles:
        out.append('<p class="note">a latency budget is held against profile results; none was given.</p>')
    for r, _ in p.profiles:
        if r.source in p.budget_errors:
            out.append(f'<h3>{_e(_label(r))}</h3><p class="bad">{_e(p.budget_errors[r.source])}</p>')
            continue
        v = p.verdicts[r.source]
        rows, classes = [], []
        for row in (*v.stages, v.end_to_end):
            if row.ok is None:
                mark = '<span class="note">no allowance</span>'
            elif row.ok:
                mark = '<span class="ok">within</span>'
            else:
                mark = '<span class="bad">OVER</span>' + (
                    " &mdash; breaks the budget first" if row.name == v.breaking_stage else ""
                )
            rows.append(
                [
                    _e(row.name),
                    _ms(row.allowance_ms),
                    _ms(row.measured_ms),
                    "-" if row.over_by_ms is None else f"{row.over_by_ms:+.3f}",
                    "-" if row.ratio is None else f"{row.ratio:.2f}x",
                    f"{row.share:.0%}",
                    mark,
                ]
            )
            cls = "breaks" if row.name == v.breaking_stage else ("over" if row.ok is False else "")
            classes.append(("total " + cls).strip() if row is v.end_to_end else cls)
        css = "ok" if v.ok else "bad"
        out.append(f"<h3>{_e(_label(r))} ({v.n:,} iterations)</h3>")
        out.append(f'<p class="verdict {css}"><span class="{css}">{_e(v.headline())}</span></p>')
        out.append(
            _table(
                ["stage", "allowance ms", f"measured {q} ms", "over by ms", "x allowance", "share of time", "verdict"],
                rows,
                num=(1, 2, 3, 4, 5),
                classes=classes,
            )
        )
        out.extend(f'<p class="note">budget: {_e(w)}</p>' for w in v.warnings)
    return "".join(out)


def _slo_ms(doc: Mapping[str, Any]) -> float | None:
    from latencylab.load.plots import objective_threshold_ms

    slo = (doc.get("summary") or {}).get("slo")
    text = slo.get("objective") if isinstance(slo, Mapping) else slo
    try:
        return objective_threshold_ms(str(text)) if text else None
    except LatencyLabError:
        return None


def _distribution_section(p: _Parsed) -> str:
    out = []
    for r, pr in p.profiles:
        v = p.verdicts.get(r.source)
        deadline = v.budget.deadline_ms if v else None
        q = v.budget.quantile if v else 0.99
        out.append(f"<h3>{_e(_label(r))} (profile)</h3>")
        cap = "End-to-end latency per iteration: histogram and tail (1 - CDF)."
        out.append(_figure(cap, figures.profile_distribution, pr, deadline, q))
    for r, lr in p.loads:
        out.append(f"<h3>{_e(_label(r))} (load)</h3>")
        cap = "Latency of successful requests from the intended send time (HDR buckets)."
        out.append(_figure(cap, figures.load_histogram, lr))
        cap = (
            "CDF and tail: corrected (from intended send) vs uncorrected (from actual send), "
            "and the generator's lateness."
        )
        out.append(_figure(cap, figures.load_cdf, lr))
    return "".join(out)


TOKEN_ROWS = (
    ("ttft", "TTFT (from intended send)"), ("ttft_uncorrected", "TTFT (from actual send)"), ("tpot", "TPOT"),
    ("itl", "ITL (every gap)"), ("e2e", "E2E (from intended send)"),
)  # fmt: skip


def _token_table(t: Mapping[str, Any]) -> str:
    rows = []
    for key, name in TOKEN_ROWS:
        d = t.get(key)
        if not isinstance(d, Mapping):
            rows.append([_e(name), "-", "-", "-", "-", "-", "0"])
            continue

        def ci(q: str, d: Mapping[str, Any] = d) -> str:
            c = d.get(f"{q}_ci_ms")
            return f"[{_ms(c[0])}, {_ms(c[1])}]" if c else "-"

        rows.append([_e(name), _ms(d.get("p50_ms")), ci("p50"), _ms(d.get("p90_ms")), _ms(d.get("p99_ms")),
                     ci("p99"), f"{int(d.get('n', 0)):,}"])  # fmt: skip
    head = ["metric", "p50 (ms)", "p50 95% CI", "p90 (ms)", "p99 (ms)", "p99 95% CI", "n"]
    return _table(head, rows, num=(1, 2, 3, 4, 5, 6))


def _tokens_section(p: _Parsed) -> str:
    """Generative load results: TTFT/TPOT/ITL/E2E percentiles with CIs, output tokens, goodput, two figures."""
    out = []
    for r, lr in p.loads:
        t = lr.summary.get("tokens")
        if not figures.has_tokens(lr):
            continue
        assert isinstance(t, Mapping)
        api = lr.target.get("api", "?")
        out.append(f"<h3>{_e(_label(r))} (streaming load, {_e(api)}, {int(t['requests']):,} streamed requests)</h3>")
        out.append(_token_table(t))
        rate, per = t.get("output_tokens_per_s"), t.get("request_output_tokens_per_s_p50")
        line = (
            f"output tokens: {int(t.get('output_tokens', 0)):,} (mean {float(t.get('output_tokens_mean') or 0):.1f} "
            f"per request); {float(rate or 0):.1f} tokens/s in aggregate; per request p50 {float(per or 0):.1f} "
            "tokens/s"
        )
        out.append(f'<p class="note">{_e(line)}</p>')
        for v in t.get("slo") or []:
            out.append(f'<p class="note">SLO {_e(v.get("objective"))}: {_e(v.get("text"))}</p>')
        if t.get("slo"):
            good = f"goodput {float(t.get('goodput') or 0):.2f} requests/s met every objective ({t.get('good')} of "
            out.append(f'<p class="note">{_e(good + str(lr.summary.get("sent")) + ")")}</p>')
        stalls = t.get("stalls") or {}
        if stalls.get("gaps"):
            out.append(
                f'<p class="note">{_e(stalls["gaps"])} token gaps over {_ms(stalls["threshold_ms"])} ms '
                f"({_e(stalls['factor'])} x the ITL median) in {_e(stalls.get('window_count', 0))} stall windows, "
                f"{_ms(stalls['stalled_ms'])} ms in all</p>"
            )
        cap = f"{_label(r)}: tails of TTFT, TPOT, ITL and E2E (1 - CDF from the HDR histograms); dots: p99."
        out.append(_figure(cap, figures.token_cdf, lr))
        cap = f"{_label(r)}: TTFT and ITL per second of the run; shaded: stall windows (gaps > 5x the ITL median)."
        out.append(_figure(cap, figures.token_over_time, lr))
    return "".join(out)


def _breakdown_section(p: _Parsed) -> str:
    out = []
    if p.profiles:
        cap = "Mean time per stage, stacked in pipeline order; labels give each stage's share."
        out.append(_figure(cap, figures.stage_shares, [(_label(r), pr) for r, pr in p.profiles]))
    for r, pr in p.profiles:
        v = p.verdicts.get(r.source)
        cap = "p50 and the held quantile per stage"
        if v is not None:
            cap += "; black marks are the budget's allowances; a red outline is a stage over its allowance"
        out.append(_figure(f"{_label(r)}: {cap}.", figures.profile_breakdown, pr, v))
    for r, lr in p.loads:
        if lr.server:
            cap = f"{_label(r)}: server-side stage means (from /metrics) vs the client's mean latency."
            out.append(_figure(cap, figures.server_breakdown, lr))
    return "".join(out)


def _over_time_section(p: _Parsed) -> str:
    out = []
    for r, pr in p.profiles:
        v = p.verdicts.get(r.source)
        spikes = (r.doc.get("summary") or {}).get("spikes") or []
        cap = f"{_label(r)}: every iteration (dots) and windowed p50/p99; shaded: spikes found."
        out.append(_figure(cap, figures.profile_over_time, pr, spikes, v.budget.deadline_ms if v else None))
    for r, lr in p.loads:
        cap = f"{_label(r)}: p50 and p99 per second of intended send time; bars: shed / failed."
        out.append(_figure(cap, figures.load_over_time, lr))
    return "".join(out)


def _throughput_section(p: _Parsed) -> str:
    out = []
    for r in p.capacities:
        cap = r.doc.get("capacity") or {}
        slo = _slo_ms({"summary": {"slo": cap.get("slo")}})
        text = (
            f"{_label(r)}: capacity search, p50/p99 against throughput per step (filled: passed {cap.get('slo', '')})."
        )
        out.append(_figure(text, figures.capacity_curve, cap.get("steps") or [], slo))
    for r, lr in p.loads:
        if lr.capacity and lr.capacity.get("steps"):
            out.append(_figure(f"{_label(r)}: capacity steps.", figures.capacity_curve, lr.capacity["steps"], None))
    pts = [
        figures.ThroughputPoint(
            _label(r), float(lr.summary["achieved_rate"]), lr.summary.get("p50_ms"), lr.summary.get("p99_ms")
        )
        for r, lr in p.loads
        if lr.summary.get("achieved_rate") is not None
    ]
    if len(pts) >= 2:  # one run is one point: nothing to see against throughput
        slos = {s for _, lr in p.loads if (s := _slo_ms({"summary": lr.summary})) is not None}
        slo = slos.pop() if len(slos) == 1 else None
        cap = "Each load run's p50 and p99 against the rate it achieved."
        out.append(_figure(cap, figures.latency_vs_throughput, pts, slo))
    return "".join(out)


def _x(v: Any) -> str:
    return f"{float(v):.2f}x" if figures.finite(v) else "-"


def _speedup_table(s: Mapping[str, Any]) -> str:
    """The choice's speed-up split: the model at equal work (the baseline's inputs), the pipeline (a shape
    policy that changed the inputs), the total, and the model's on each held-out input set. Older results
    carry only ``speedup_p50``."""
    model = s.get("speedup", s.get("speedup_p50"))
    if not figures.finite(model) and not figures.finite(s.get("total_speedup")):
        return ""
    rows = [[_e("model, at equal work (the baseline's inputs)" if "speedup" in s else "baseline p50 / chosen p50"),
             f"<b>{_x(model)}</b>"]]  # fmt: skip
    pipeline = s.get("pipeline_speedup")
    if "pipeline_speedup" in s:
        rows.append(
            ["pipeline (a shape policy changed the inputs)", _x(pipeline)]
            if figures.finite(pipeline)
            else ["pipeline", '<span class="note">none: the inputs as the baseline ran them</span>']
        )
    if figures.finite(s.get("total_speedup")):
        rows.append(["total (model x pipeline)", f"<b>{_x(s['total_speedup'])}</b>"])
    for name, v in (s.get("speedup_by_set") or {}).items():
        rows.append([f"model, on input set <i>{_e(name)}</i>", _x(v)])
    out = _table(["speed-up of the choice over the baseline (p50)", ""], rows, num=(1,)).replace(
        "<table>", '<table class="narrow">', 1
    )
    if s.get("baseline_inputs"):
        out += f'<p class="note">baseline: {_e(s["baseline_inputs"])}</p>'
    cut = s.get("skipped_by_time_cap") or []
    if cut:
        out += (f'<p class="note">the search\'s time cap cut {len(cut)} candidate(s) before they were built: '
                f"{_e(', '.join(map(str, cut)))}</p>")  # fmt: skip
    return out


def _optimize_section(p: _Parsed) -> str:
    out = []
    for r in p.optimizes:
        d, s = r.doc, r.doc.get("summary") or {}
        out.append(f"<h3>{_e(_label(r))}: {_e((d.get('model') or {}).get('model', ''))}</h3>")
        out.append(f'<p class="verdict ok">{_e(s.get("verdict", ""))}</p>')
        out.append(_speedup_table(s))
        loss = figures.fidelity_loss(d)
        budget = f" beyond the budget ({loss.clause})" if loss.clause else ""  # _figure escapes the caption
        cap = (
            f"Candidates at (p50 latency, {loss.label}), both log scales: up is closer to the FP32 reference, so "
            f"0.99 and 0.999 stand a decade apart; the dashed red line is the fidelity budget, the shaded band lies"
            f"{budget}. Only the Pareto front (ringed, joined) and the choice (star) are named; every other "
            "candidate is in the table below, sorted by p50 as the x axis is. Diamond: the FP32 baseline; hollow: "
            "outside the budget; colour: backend."
        )
        out.append(_figure(cap, figures.pareto_front, d))
        chosen = (s.get("chosen") or {}).get("name")
        front = set(s.get("pareto") or [])
        label, score = figures.fidelity_score(d)
        rows, classes = [], []
        cands = sorted(
            d.get("candidates") or [],
            key=lambda c: (not figures.finite(c.get("p50_ms")), c.get("p50_ms") or 0.0),
        )
        for c in cands:
            ci = c.get("p50_ci_ms")
            p50 = (
                "-"
                if c.get("p50_ms") is None
                else f"{c['p50_ms']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            )
            fid = score(c)
            lv = loss.value(c)
            name = (
                _e(c["name"])
                + (" &#9733; chosen" if c["name"] == chosen else "")
                + (" (Pareto)" if c["name"] in front else "")
            )
            rows.append(
                [
                    name,
                    _e(c.get("backend", "")),
                    _e(c.get("status", "")),
                    p50,
                    _ms(c.get("p99_ms")),
                    "-" if c.get("speedup_p50") is None else f"{c['speedup_p50']:.2f}x",
                    "-" if fid is None else f"{fid:.4f}",
                    "-" if lv is None else f"{lv:.2e}",
                    _e(c.get("reason", "")),
                ]
            )
            classes.append("total" if c["name"] == chosen else "")
        out.append(
            _table(
                ["candidate", "backend", "status", "p50 ms [95% CI]", "p99 ms", "speed-up", label, loss.short, "why"],
                rows,
                num=(3, 4, 5, 6, 7),
                classes=classes,
            )
        )
    return "".join(out)


def _optimize_gen_section(p: _Parsed) -> str:
    """optimize --workload gen: the verdict, the choice and its recipe, the plot, every candidate's row."""
    from latencylab.report.optimize_gen import HEAD, NUMERIC, cells, choice_line, ordered

    out = []
    for r, res in p.gens:
        work = f"{res.tokens} output tokens a request, {res.rounds} interleaved rounds" if res.tokens else ""
        out.append(f"<h3>{_e(_label(r))}: {_e(res.model.get('model', ''))}</h3>")
        out.append(f'<p class="note">budget {_e(res.budget)}; {_e(work)}; baseline {_e(res.baseline)} '
                   "(eager FP32); speed-ups are the baseline's TPOT over the candidate's at equal work (same "
                   "prompts, same output tokens, same threads)</p>")  # fmt: skip
        css = "ok" if res.chosen else "bad"
        out.append(f'<p class="verdict {css}">{_e(res.verdict)}</p><p>{_e(choice_line(res))}</p>')
        rec = res.recipe_check
        if rec is not None:
            keys = ("speedup_tpot", "tpot_ms", "token_agreement", "exact", "top1", "ppl_delta")
            rows = [[_e(k), *(_ms((rec.get(w) or {}).get(k), 4) for w in ("recorded", "reproduced"))] for k in keys]
            out.append(_table(["the recipe's choice", "recorded", "reproduced now"], rows, num=(1, 2)))
            out.extend(f'<p class="note">--force: {_e(m)}</p>' for m in rec.get("forced") or [])
        cap = (
            "Each measured candidate at (TPOT speed-up over eager FP32 at equal work, with the 95% CI of the paired "
            "ratios; fidelity loss against FP32's answers), both log scales, up and right is better; the dashed red "
            "line is the fidelity budget on that metric (hollow: outside the budget on any of its terms). Only the "
            "Pareto front (ringed, joined) and the choice (star) are named; every candidate is in the table below, "
            "fastest first. Diamond: the FP32 baseline; colour: family."
        )
        out.append(_figure(cap, figures.gen_speedup_fidelity, res))
        rows, classes = [], []
        for c in ordered(res):
            rows.append([_e(x) for x in cells(c, res.chosen)])
            classes.append("total" if c.name == res.chosen else ("over" if c.status == "outside-budget" else ""))
        out.append(_table(HEAD, rows, num=NUMERIC, classes=classes))
    return "".join(out)


def _ladder_section(p: _Parsed) -> str:
    out = []
    for r in p.serves:
        d = r.doc
        out.append(f"<h3>{_e(_label(r))}</h3>")
        cap = (
            "Ladder level over time (green step line, right axis; top = primary), the guard's window p99 and the "
            "client's p99 per second (left, log); red band: alarm (serving from cache)."
        )
        out.append(_figure(cap, figures.ladder_over_time, d))
        rows = []
        for t in d.get("transitions") or []:
            sw = t.get("switch_time_s")
            rows.append(
                [
                    "-" if t.get("t_s") is None else f"{float(t['t_s']):.2f}",
                    f"{_e(t.get('from_name', t.get('from_level')))} &rarr; {_e(t.get('to_name', t.get('to_level')))}",
                    _e(t.get("reason", "")),
                    "-" if sw is None else f"{sw * 1e3:.1f}",
                ]
            )
        if rows:
            out.append(_table(["t (s)", "step", "reason", "switch ms"], rows, num=(0, 3)))
    return "".join(out)


def _env_line(inp: ReportInput) -> str:
    for r in inp.results:
        env = r.doc.get("env") or {}
        cpu = env.get("cpu") or {}
        if cpu:
            py = (env.get("python") or {}).get("version", "")
            return f"{cpu.get('model', '?')}, {cpu.get('logical_cpus', '?')} logical CPUs" + (
                f", Python {py}" if py else ""
            )
    return ""


def render_report(inp: ReportInput) -> str:
    """The whole HTML document as a string."""
    p = _parse(inp)
    sections: list[tuple[str, str, str]] = [("inputs", "Inputs at a glance", _inputs_section(inp))]
    sections.append(("findings", "Findings", _findings_section(inp)))
    if inp.budget is not None:
        sections.append(("budget", "Latency budget", _budget_section(inp, p)))
    for key, title, build in (
        ("distribution", "Latency distribution", _distribution_section),
        ("tokens", "Token latency (generative load)", _tokens_section),
        ("breakdown", "Stage breakdown", _breakdown_section),
        ("over-time", "Latency over time", _over_time_section),
        ("throughput", "Latency vs throughput", _throughput_section),
        ("optimize", "Optimisation: latency vs fidelity", _optimize_section),
        ("optimize-gen", "Generative optimisation: TPOT vs fidelity", _optimize_gen_section),
        ("ladder", "SLO guard ladder", _ladder_section),
    ):
        body = build(p)
        if body:
            sections.append((key, title, body))
    nav = "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t, _ in sections)
    body = "".join(f'<section id="{k}"><h2>{_e(t)}</h2>{b}</section>' for k, t, b in sections)
    env = _env_line(inp)
    meta = f"generated {_e(inp.created_at)} by latencylab {_e(__version__)} from {len(inp.results)} result file(s)"
    if env:
        meta += f"; measured on {_e(env)}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(inp.title)}</title><style>{CSS}</style></head>"
        f'<body><main><h1>{_e(inp.title)}</h1><p class="meta">{meta}</p><nav>{nav}</nav>{body}</main></body></html>\n'
    )

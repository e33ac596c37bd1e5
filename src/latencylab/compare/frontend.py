"""``latencylab compare``: render a :class:`~latencylab.compare.model.Comparison`, and the CLI glue."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from latencylab.compare.core import compare_docs, compare_files
from latencylab.compare.model import Comparison, Gate, GateResult, label
from latencylab.compare.stats import MetricDelta
from latencylab.errors import LatencyLabError

if TYPE_CHECKING:
    from rich.console import Console

SHOWN = ("p50", "p90", "p99", "mean")  # table rows per series; every metric is in the JSON
_MAX_CONFIG_LINES = 12


def _value(v: float, unit: str) -> str:
    if unit == "ns":
        return f"{v / 1e6:.4g} ms"
    if unit == "1/s":
        return f"{v:.4g}/s"
    return f"{v * 100:.3g}%"


def _change(v: float, unit: str) -> str:
    if unit == "ns":
        return f"{v / 1e6:+.3g} ms" if abs(v) >= 1e6 or v == 0 else f"{v / 1e3:+.3g} us"
    if unit == "1/s":
        return f"{v:+.3g}/s"
    return f"{v * 100:+.3g} pp"


def _pct(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "+inf%" if v > 0 else "-inf%"
    return f"{v * 100:+.1f}%"


def _ci(m: MetricDelta) -> str:
    if m.rel_ci_low is None or m.rel_ci_high is None or m.unit == "fraction":  # an error rate's CI reads in pp
        return f"[{_change(m.ci_low, m.unit)}, {_change(m.ci_high, m.unit)}]"
    return f"[{_pct(m.rel_ci_low)}, {_pct(m.rel_ci_high)}]"


def _p(p: float, n_boot: int | None = None) -> str:
    if n_boot is not None and p < 1.0 / n_boot:
        return f"<{1.0 / n_boot:.0g}"  # a bootstrap p-value cannot resolve below 1/B
    return f"{p:.2g}" if p >= 0.001 else "<0.001"


def _p_eq(p: float) -> str:
    text = _p(p)
    return text if text.startswith("<") else "=" + text


def verdict(m: MetricDelta, noise: float) -> str:
    """One word for a metric's change: flagged changes say which way, the rest why they are not flagged."""
    if m.flagged:
        up = m.diff > 0
        if m.unit == "ns":
            return "slower" if up else "faster"
        return "higher" if up else "lower"
    if m.significant and not m.enough:
        return "too few tail samples"
    if m.significant:
        return f"within noise (<{noise:.0%})"
    return "no sig. change"


def _style(m: MetricDelta) -> str:
    if not m.flagged:
        return ""
    worse = (m.diff > 0) != (m.metric == "throughput")
    return "red" if worse else "green"


def _row_cells(m: MetricDelta, n_boot: int | None) -> list[str]:
    star = "" if m.enough else "*"
    return [
        label(m.metric) + star,
        _value(m.baseline, m.unit),
        _value(m.candidate, m.unit),
        _change(m.diff, m.unit),
        _pct(m.rel),
        _ci(m),
        _p(m.p_value, n_boot if m.method == "bootstrap" else None),
    ]


def gate_line(g: GateResult, confidence: float) -> str:
    d = g.delta
    where = f"{g.series} {label(d.metric)}" if g.series != "run" else label(d.metric)
    figures = (
        f"{where} {_value(d.baseline, d.unit)} -> {_value(d.candidate, d.unit)}, "
        f"{_change(d.diff, d.unit)} ({_pct(d.rel)}), {confidence:.0%} CI {_ci(d)}, p{_p_eq(d.p_value)}"
    )
    if g.fired and g.undecided:
        return f"FAIL {g.gate.text} (--strict): {figures}\n    undecided without --strict: {g.why}"
    if g.fired:
        return f"FAIL {g.gate.text}: {figures}"
    if g.undecided:
        beyond = g.gate.describe_threshold()
        return f"undecided {g.gate.text}: beyond {beyond} and significant: {figures}\n    but {g.why}"
    if g.beyond and d.significant and not d.enough:
        return f"pass {g.gate.text}: undecided, {label(d.metric)} rests on too few tail samples: {figures}"
    if g.beyond:
        return f"pass {g.gate.text}: beyond {g.gate.describe_threshold()} but not significant: {figures}"
    return f"pass {g.gate.text}: within {g.gate.describe_threshold()}: {figures}"


def _short(v: object) -> str:
    text = " ".join(map(str, v)) if isinstance(v, list) else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def render(c: Comparison, console: Console) -> None:
    """The comparison as a table, then env/config differences, gates, warnings and notes."""
    from rich.markup import escape
    from rich.table import Table

    conf = f"{c.confidence:.0%}"
    if c.level == "iteration":
        how = f"{conf} CI of the change by percentile bootstrap over iterations (B={c.n_boot}); rank: Mann-Whitney U"
    else:
        how = (
            "each metric taken per run; baseline and candidate = geometric means over runs; "
            f"{conf} CI of the change by "
            + (
                "a paired t test on the per-round log ratios (A and B interleaved)"
                if c.level == "paired"
                else "Welch's t on the per-run logs (the spread between runs is the noise floor)"
            )
        )
    table = Table(
        title=f"latencylab compare ({c.result_kind}, {c.level} level): {escape(c.baseline)} -> {escape(c.candidate)}",
        caption=(
            f"change = candidate - baseline; {how}; "
            f"flagged when the CI excludes 0 and |change| >= {c.noise:.0%}; "
            "* = fewer than 10 samples beyond the percentile"
            + (" (in the shortest run)" if c.level != "iteration" else "")
            + ("; run: Poisson (throughput) and Fisher (error rate) tests" if c.rates else "")
        ),
    )
    for col, just in (
        ("series", "left"),
        ("metric", "left"),
        ("baseline", "right"),
        ("candidate", "right"),
        ("change", "right"),
        ("change %", "right"),
        (f"{conf} CI", "right"),
        ("p", "right"),
        ("verdict", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in c.series:
        first = True
        for m in s.metrics:
            if m.metric not in SHOWN:
                continue
            name = ""
            if first:
                name = f"{escape(s.name)} (n {s.n_baseline}/{s.n_candidate}"
                if s.level != "iteration":
                    name += f", runs {s.runs_baseline}/{s.runs_candidate}, run-to-run {_spread(s.spread_baseline)}"
                    name += f"/{_spread(s.spread_candidate)}"
                name += ")"
            table.add_row(name, *_row_cells(m, c.n_boot), verdict(m, c.noise), style=_style(m))
            first = False
        r = s.rank
        if r is None:
            table.add_section()
            continue
        table.add_row(
            "",
            "rank",
            "",
            "",
            f"P(c>b)={r.prob_greater:.3f}",
            "",
            "",
            _p(r.p_value),
            ("distributions differ" if r.p_value < c.alpha else "no sig. shift"),
            end_section=True,
        )
    for m in c.rates:
        table.add_row("run", *_row_cells(m, None), verdict(m, c.noise), style=_style(m))
    console.print(table)

    flagged = [(s.name, m) for s in c.series for m in s.metrics if m.flagged and m.metric in SHOWN] + [
        ("run", m) for m in c.rates if m.flagged
    ]
    if flagged:
        parts = [f"{n} {label(m.metric)} {_pct(m.rel)} ({verdict(m, c.noise)})" for n, m in flagged]
        console.print("changed: " + escape("; ".join(parts)))
    else:
        console.print(
            f"changed: nothing (no change of p50/p90/p99/mean is significant at {c.alpha:g} and >= {c.noise:.0%})"
        )

    if c.env:
        console.print("environment differences that may explain a change:")
        for d in c.env:
            console.print(
                f"  {d.impact:<6} {escape(d.path)}: {escape(_short(d.baseline))} -> {escape(_short(d.candidate))}"
            )
    else:
        console.print("environment: no latency-relevant difference")
    if c.config:
        console.print("configuration differences:")
        for d in c.config[:_MAX_CONFIG_LINES]:
            console.print(f"  {escape(d.path)}: {escape(_short(d.baseline))} -> {escape(_short(d.candidate))}")
        if len(c.config) > _MAX_CONFIG_LINES:
            console.print(f"  ... and {len(c.config) - _MAX_CONFIG_LINES} more (see --json)")
    console.print("level: " + LEVEL_LINES[c.level])
    if c.gates:
        console.print(f"gates (fire when beyond the threshold and significant at alpha={c.alpha:g}):")
        for g in c.gates:
            console.print("  " + escape(gate_line(g, c.confidence)), style="bold red" if g.fired else None)
    for s in c.series:
        for w in s.warnings:
            console.print(f"warning: {escape(w)}")
    for n in c.notes:
        console.print(f"note: {escape(n)}")


LEVEL_LINES = {
    "iteration": (
        "one run a side. The figures above compare two runs' iterations; they cannot tell a change of the "
        "program from a change of the machine between the runs, so a gate they would fire is undecided "
        "(exit 0; --strict fails it). Measure with profile --runs N, or compare --run A B (interleaved)."
    ),
    "run": "the run is the unit: a change must exceed the spread between runs to be significant.",
    "paired": "A and B ran interleaved in randomised blocks; each round's B/A ratio is one paired observation.",
}


def _spread(s: float | None) -> str:
    return "-" if s is None else f"±{s * 100:.1f}%"


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """``latencylab compare``'s options as typed values (see ``latencylab compare --help``); built from the
    parsed command line by :meth:`from_args`, the one place that reads the namespace."""

    baseline: str | None = None  # BASELINE.json
    candidate: str | None = None  # CANDIDATE.json
    run: tuple[str, str] | None = None  # --run A B: two specs measured interleaved instead of two files
    rounds: int = 20
    iterations: int = 100
    warmup: int = 10
    seed: int = 0
    keep: str | None = None  # --run: also write DIR/A.json and DIR/B.json
    strict: bool = False  # an undecided gate fails when its evidence says so
    fail_if: tuple[str, ...] = ()  # gates, e.g. "p99>+5%"
    alpha: float = 0.05
    json: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CompareOptions:
        run = getattr(args, "run", None)
        return cls(
            baseline=args.baseline,
            candidate=args.candidate,
            run=(run[0], run[1]) if run else None,
            rounds=args.rounds,
            iterations=args.iterations,
            warmup=args.warmup,
            seed=args.seed,
            keep=args.keep,
            strict=bool(getattr(args, "strict", False)),
            fail_if=tuple(args.fail_if or ()),
            alpha=args.alpha,
            json=args.json,
        )


def run_compare_command(args: argparse.Namespace, console: Console) -> int:
    """CLI entry point: 0 when no gate fired, 1 when one did (usage errors raise LatencyLabError: exit 2)."""
    return run_compare(CompareOptions.from_args(args), console)


def run_compare(opts: CompareOptions, console: Console) -> int:
    """Compare as the options say and print the comparison; the exit code (1: a gate fired).

    Two files, or ``run`` (A, B): measure the two specs interleaved first (``compare.interleave``).
    """
    gates = list(opts.fail_if)
    strict = opts.strict
    if opts.run:
        if opts.baseline or opts.candidate:
            raise LatencyLabError("give either two result files or --run A B, not both")
        comparison = _run_and_compare(opts, list(opts.run), gates, strict, console)
    else:
        if not opts.baseline or not opts.candidate:
            raise LatencyLabError("give two result files (BASELINE.json CANDIDATE.json) or --run A B")
        comparison = compare_files(opts.baseline, opts.candidate, gates=gates, alpha=opts.alpha, strict=strict)
    render(comparison, console)
    if opts.json:
        console.print(f"wrote {comparison.save(opts.json)}")
    if comparison.failed:
        fired = ", ".join(g.gate.text for g in comparison.failed)
        console.print(f"compare: {len(comparison.failed)} gate(s) fired: {fired}", style="bold red")
    elif comparison.undecided:
        names = ", ".join(g.gate.text for g in comparison.undecided)
        console.print(f"compare: {len(comparison.undecided)} gate(s) undecided, not failed: {names}", style="yellow")
    return comparison.exit_code


def _run_and_compare(
    opts: CompareOptions, specs: list[str], gates: list[str], strict: bool, console: Console
) -> Comparison:
    from pathlib import Path

    from latencylab.analysis import save_profile
    from latencylab.compare.interleave import run_interleaved

    parsed = [Gate.parse(g) for g in gates]  # a bad gate fails before minutes of measuring
    rounds, iterations = opts.rounds, opts.iterations
    console.print(
        f"measuring A and B interleaved: {rounds} rounds x (A, B in random order) x "
        f"({opts.warmup} warm-up + {iterations} timed iterations)"
    )
    console.print(f"  A: {specs[0]}\n  B: {specs[1]}", markup=False)
    a, b = run_interleaved(specs, rounds=rounds, iterations=iterations, warmup=opts.warmup, seed=opts.seed)
    if opts.keep:
        out = Path(opts.keep)
        console.print(f"wrote {save_profile(a, out / 'A.json')} and {save_profile(b, out / 'B.json')}")
    return compare_docs(
        a.to_dict(), b.to_dict(), parsed, opts.alpha, names=("A", "B"),
        strict=strict,
    )  # fmt: skip

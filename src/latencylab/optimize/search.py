"""The accuracy-guarded search: fidelity first, then interleaved latency, Pareto front, one honest choice.

1. The baseline (the first candidate, FP32 eager by convention) runs every held-out feed: its outputs
   are the reference.
2. Every other candidate is built (timed; a build failure is recorded, the search goes on) and run on
   the same held-out feeds; fidelity is computed against the reference. Candidates outside the budget
   get a short latency measurement only (they are reported, but are not worth timing at length).
3. Latency: ``rounds`` rounds; in each, every live candidate runs ``per_round`` calls, in an order
   rotated every round (A B C, B C A, ...), so machine drift and thermal state hit all of them alike.
   Each call is one feed (cycling through the held-out feeds), timed on the injected Clock (perf_counter_ns
   by default) by :func:`latencylab.timing.time_calls`.
4. The choice is the lowest-p50 candidate inside the budget whose p50 is below the baseline's by more
   than the noise (its p50 CI's upper end is below the baseline's p50 CI's lower end). If none is,
   the answer is "no improvement found": never a variant slower than the baseline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import stats as lstats
from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError, NotApplicable
from latencylab.optimize.types import BuildContext, Candidate, Feed, Runner
from latencylab.timing import now_ns, rotated, time_calls

# ------------------------------------------------------------------ budget

_BUDGET_TERM = re.compile(
    r"^\s*(cos|min_cos|top1|accuracy_drop|max_abs)\s*(>=|<=)\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*$"
)
DEFAULT_BUDGETS = {"embedding": "cos>=0.99,min_cos>=0.98", "logits": "accuracy_drop<=1%"}
# Without task labels a classifier is judged by agreement with the FP32 model's top-1 instead.
DEFAULT_BUDGET_NO_LABELS = {"embedding": DEFAULT_BUDGETS["embedding"], "logits": "top1>=0.99"}
# Each metric's direction (a fidelity budget bounds it on the side of "worse") and the values it can take.
_METRICS: dict[str, tuple[str, float, float]] = {
    "cos": (">=", -1.0, 1.0),
    "min_cos": (">=", -1.0, 1.0),
    "top1": (">=", 0.0, 1.0),
    "accuracy_drop": ("<=", 0.0, 1.0),
    "max_abs": ("<=", 0.0, float("inf")),
}
NEEDS_LABELS = ("accuracy_drop",)


@dataclass(frozen=True, slots=True)
class Budget:
    """Conjunction of fidelity bounds, e.g. ``cos>=0.99,min_cos>=0.98`` or ``accuracy_drop<=1%``.

    :meth:`parse` refuses what could never be met or bounds nothing: an empty budget, a bound on the wrong
    side (``cos<=0.9`` would keep only the worse variants), or beyond the metric's range (``cos>=1.5``,
    ``top1>=1.01``, ``accuracy_drop<=150%``). A budget on ``accuracy_drop`` needs task labels
    (:meth:`check_applies`).
    """

    terms: tuple[tuple[str, str, float], ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> Budget:
        if not text.strip():
            raise LatencyLabError(
                "the budget is empty: give at least one clause, e.g. cos>=0.99 or top1>=0.99 (or leave --budget out "
                "for the default)"
            )
        terms = []
        for part in text.split(","):
            m = _BUDGET_TERM.match(part)
            if not m:
                raise LatencyLabError(
                    f"budget term {part.strip()!r} is not understood: use e.g. cos>=0.99, min_cos>=0.98, "
                    "top1>=0.99, accuracy_drop<=1%, max_abs<=0.05"
                )
            metric, op = m.group(1), m.group(2)
            value = float(m.group(3)) / (100.0 if m.group(4) else 1.0)
            direction, lo, hi = _METRICS[metric]
            if op != direction:
                other = "below" if direction == ">=" else "above"
                raise LatencyLabError(
                    f"budget term {part.strip()!r} bounds {metric} from the wrong side: a fidelity budget bounds it "
                    f"from {other} ({metric}{direction}{m.group(3)}{m.group(4)})"
                )
            if not lo <= value <= hi:
                what = "can never be met" if direction == ">=" else "bounds nothing"
                raise LatencyLabError(f"budget term {part.strip()!r} {what}: {metric} lies in [{lo:g}, {hi:g}]")
            terms.append((metric, op, value))
        return cls(tuple(terms), text)

    def check_applies(self, has_labels: bool, model: str = "this model") -> None:
        """Raise when a term needs what the model does not have (``accuracy_drop`` without task labels)."""
        needs = [t[0] for t in self.terms if t[0] in NEEDS_LABELS]
        if needs and not has_labels:
            raise LatencyLabError(
                f"budget {self.text!r}: {needs[0]} needs task labels and {model} has none: bound the agreement "
                "with the FP32 model instead, e.g. top1>=0.99 (classifiers) or cos>=0.99 (embeddings)"
            )

    def check(self, f: Fidelity) -> tuple[bool, str]:
        for metric, op, bound in self.terms:
            v = f.value(metric)
            if v is None:
                return False, f"{metric} is not available for this model"
            ok = v >= bound if op == ">=" else v <= bound
            if not ok:
                return False, f"{metric} {v:.4f} {'<' if op == '>=' else '>'} {bound:g}"
        return True, "inside budget"


# ------------------------------------------------------------------ fidelity


@dataclass(frozen=True, slots=True)
class Fidelity:
    n: int
    cos_mean: float
    cos_min: float
    max_abs: float
    top1: float  # agreement of argmax with the reference
    accuracy: float | None = None  # task metric where labels exist
    reference_accuracy: float | None = None

    def value(self, metric: str) -> float | None:
        if metric == "cos":
            return self.cos_mean
        if metric == "min_cos":
            return self.cos_min
        if metric == "top1":
            return self.top1
        if metric == "max_abs":
            return self.max_abs
        if metric == "accuracy_drop":
            if self.accuracy is None or self.reference_accuracy is None:
                return None
            return self.reference_accuracy - self.accuracy
        raise KeyError(metric)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "cos_mean": self.cos_mean,
            "cos_min": self.cos_min,
            "max_abs": self.max_abs,
            "top1": self.top1,
            "accuracy": self.accuracy,
            "reference_accuracy": self.reference_accuracy,
        }


def fidelity(reference: np.ndarray, outputs: np.ndarray, labels: np.ndarray | None = None) -> Fidelity:
    """Row-wise cosine (mean, min), max |difference|, argmax agreement, and accuracy against labels."""
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    out = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    if ref.shape != out.shape:
        raise LatencyLabError(f"output shape {out.shape} differs from the reference {ref.shape}")
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
    cos = np.where(norms > 0, (ref * out).sum(axis=1) / np.maximum(norms, 1e-30), 0.0)
    if not np.isfinite(out).all():
        cos = np.where(np.isfinite(out).all(axis=1), cos, -1.0)
    top1 = float((ref.argmax(axis=1) == out.argmax(axis=1)).mean())
    acc = ref_acc = None
    if labels is not None:
        acc = float((out.argmax(axis=1) == labels).mean())
        ref_acc = float((ref.argmax(axis=1) == labels).mean())
    with np.errstate(invalid="ignore"):
        max_abs = float(np.nanmax(np.abs(ref - out))) if np.isfinite(out).any() else float("inf")
    return Fidelity(len(ref), float(cos.mean()), float(cos.min()), max_abs, top1, acc, ref_acc)


# ------------------------------------------------------------------ results


def _latency(samples_ns: Sequence[int], label: str) -> lstats.Summary | None:
    """p50 and p99 with bootstrap CIs (None under two samples)."""
    if len(samples_ns) < 2:
        return None
    return lstats.summarize(samples_ns, qs=(0.5, 0.99), n_boot=300, label=label)


def _latency_fields(lat: lstats.Summary | None, baseline_p50_ns: float | None, p99_ci: bool) -> dict[str, Any]:
    """The JSON latency fields (ms) of ``lat``, ``p99_ci_ms`` with ``p99_ci``, and ``speedup_p50`` against
    ``baseline_p50_ns``; none when there is no latency."""
    if lat is None:
        return {}
    p50, p99 = lat.at(0.5), lat.at(0.99)
    d: dict[str, Any] = {
        "p50_ms": p50.value / 1e6,
        "p50_ci_ms": [p50.ci_low / 1e6, p50.ci_high / 1e6],
        "p99_ms": p99.value / 1e6,
    }
    if p99_ci:
        d["p99_ci_ms"] = [p99.ci_low / 1e6, p99.ci_high / 1e6]
    if baseline_p50_ns:
        d["speedup_p50"] = baseline_p50_ns / p50.value
    return d


@dataclass(frozen=True, slots=True)
class SetMeasure:
    """One candidate on one held-out input set: fidelity, timed calls, and the positions it really ran."""

    name: str
    fidelity: Fidelity | None = None
    samples_ns: tuple[int, ...] = ()
    seq_lens: tuple[int, ...] = ()  # sequence length of each fidelity call after the shape policy (text)
    tokens_per_call: float | None = None  # batch x processed length, mean over the set's feeds

    def latency(self) -> lstats.Summary | None:
        return _latency(self.samples_ns, self.name)

    def p50_ns(self) -> float | None:
        return float(np.median(self.samples_ns)) if self.samples_ns else None

    def to_dict(self, baseline_p50_ns: float | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "fidelity": None if self.fidelity is None else self.fidelity.to_dict(),
            "n": len(self.samples_ns),
            "tokens_per_call": self.tokens_per_call,
        }
        d.update(_latency_fields(self.latency(), baseline_p50_ns, p99_ci=False))
        return d


@dataclass(frozen=True, slots=True)
class CandidateResult:
    name: str
    family: str
    backend: str
    params: dict[str, Any]
    description: str
    status: str  # baseline | inside-budget | outside-budget | skipped | failed
    reason: str
    fidelity: Fidelity | None = None
    samples_ns: tuple[int, ...] = ()  # the primary input set's (the first of ``sets``)
    build_s: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    input_policy: str = "as-given"
    sets: tuple[SetMeasure, ...] = ()  # every held-out input set, the primary first

    def latency(self) -> lstats.Summary | None:
        return _latency(self.samples_ns, self.name)

    def on_set(self, name: str) -> SetMeasure | None:
        return next((m for m in self.sets if m.name == name), None)

    def to_dict(self, baseline_p50: float | None = None, base_sets: dict[str, float] | None = None) -> dict[str, Any]:
        """JSON form; ``speedup_p50`` against ``baseline_p50`` (ns, the primary set's), and each set's against
        ``base_sets`` (set name -> baseline p50 ns)."""
        d: dict[str, Any] = {
            "name": self.name,
            "family": self.family,
            "backend": self.backend,
            "params": self.params,
            "description": self.description,
            "status": self.status,
            "reason": self.reason,
            "build_s": self.build_s,
            "stats": self.stats,
            "fidelity": None if self.fidelity is None else self.fidelity.to_dict(),
            "n": len(self.samples_ns),
            "input_policy": self.input_policy,
        }
        if self.sets:
            d["sets"] = {m.name: m.to_dict(base_sets.get(m.name) if base_sets else None) for m in self.sets}
        d.update(_latency_fields(self.latency(), baseline_p50, p99_ci=True))
        return d


@dataclass(frozen=True, slots=True)
class SearchResult:
    baseline: str
    chosen: str | None  # None = no improvement found
    verdict: str
    budget: str
    candidates: tuple[CandidateResult, ...]
    pareto: tuple[str, ...]
    wall_s: float
    sets: tuple[str, ...] = ("heldout",)  # the held-out input sets, the primary first
    build_phase_s: float | None = None  # start -> the first timing round: builds and fidelity runs (+ opening)

    def by_name(self, name: str) -> CandidateResult:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)


# ------------------------------------------------------------------ the search

ProgressFn = Callable[[str, int, int], None]  # (message, step, total)
TIME_CAP_REASON = "time budget spent (cut by the search's time cap)"


def _score(f: Fidelity | None, kind: str) -> float:
    """One number for the Pareto front: higher is better."""
    if f is None:
        return -1.0
    if f.accuracy is not None:
        return f.accuracy
    return f.cos_mean if kind == "embedding" else f.top1


def pareto_front(points: Sequence[tuple[str, float, float]]) -> tuple[str, ...]:
    """Names not dominated in (latency lower, score higher); ties keep both."""
    front = []
    for name, lat, score in points:
        dominated = any(
            (lat2 <= lat and score2 >= score) and (lat2 < lat or score2 > score)
            for n2, lat2, score2 in points
            if n2 != name
        )
        if not dominated:
            front.append((lat, name))
    return tuple(name for _, name in sorted(front))


def _measure_interleaved(
    runners: dict[str, Runner],
    sets: Mapping[str, Sequence[Feed]],
    rounds: dict[str, int],
    per_round: int,
    clock: Clock,
    warmup: int = 3,
) -> dict[str, dict[str, list[int]]]:
    """candidate -> set -> timed calls. Each round visits every live candidate in an order rotated by one
    (:func:`latencylab.timing.rotated`), and each visit runs ``per_round`` calls on every input set: round r
    runs feeds r*per_round onwards (cycling), the same feeds for every candidate, so inputs of varied lengths
    never favour one of them. Each call is timed on ``clock`` (:func:`latencylab.timing.time_calls`)."""
    names = list(runners)
    for n in names:
        for feeds in sets.values():
            for i in range(warmup):
                runners[n].run(feeds[i % len(feeds)])
    samples: dict[str, dict[str, list[int]]] = {n: {s: [] for s in sets} for n in names}
    max_rounds = max(rounds.values()) if rounds else 0
    for r in range(max_rounds):
        for n in rotated(names, r):
            if r >= rounds[n]:
                continue
            for set_name, feeds in sets.items():
                # round r runs the same feeds for every candidate: equal work, whatever the lengths
                batch = [feeds[k % len(feeds)] for k in range(r * per_round, (r + 1) * per_round)]
                time_calls(runners[n].run, batch, clock, samples[n][set_name])
    return samples


def _run_set(runner: Runner, feeds: Sequence[Feed]) -> tuple[np.ndarray, tuple[int, ...], float | None]:
    """Outputs of every feed, and the sequence lengths the runner really ran (when it counts them)."""
    counter = getattr(runner, "tokens", None)
    if counter is not None:
        counter.reset()
    outs = np.concatenate([np.asarray(runner.run(f), dtype=np.float32) for f in feeds])
    if counter is None or not counter.calls:
        return outs, (), None
    return outs, tuple(counter.seq_lens), counter.per_call()


def _significantly_faster(cand: SetMeasure, base: SetMeasure) -> bool:
    a, b = cand.latency(), base.latency()
    return a is not None and b is not None and a.at(0.5).ci_high < b.at(0.5).ci_low


def result_of(cand: Candidate, status: str, reason: str, **kw: Any) -> CandidateResult:
    """A candidate's result with its recipe fields, ``status`` and ``reason`` (and any measured fields)."""
    return CandidateResult(
        cand.name, cand.family, cand.backend, dict(cand.params), cand.description, status, reason,
        input_policy=cand.input_policy, **kw,
    )  # fmt: skip


def failed_build(cand: Candidate, exc: BaseException) -> CandidateResult:
    """A build (or its held-out run) that raised: reported with the first line of the error; a build that found
    its candidate does not apply here (:class:`~latencylab.errors.NotApplicable`) is reported skipped."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, NotApplicable):
        return result_of(cand, "skipped", msg[:300])
    return result_of(cand, "failed", f"build failed: {type(exc).__name__}: {msg}"[:300])


Ran = dict[str, tuple[np.ndarray, tuple[int, ...], float | None]]  # set -> (outputs, seq lens, tokens per call)


def run_sets(runner: Runner, sets: Mapping[str, Sequence[Feed]]) -> Ran:
    """The runner on every held-out input set: outputs, sequence lengths it ran, tokens per call."""
    return {name: _run_set(runner, feeds) for name, feeds in sets.items()}


def judge(
    cand: Candidate,
    is_baseline: bool,
    ran: Ran,
    build_s: float,
    run_stats: dict[str, Any],
    reference: Mapping[str, np.ndarray],
    budget: Budget,
    labels: np.ndarray | None,
) -> CandidateResult:
    """Fidelity of ``ran`` against ``reference`` on every set and the status it gives (the baseline's is
    "baseline"); a set whose outputs cannot be compared makes the candidate "failed"."""
    sets = list(ran)
    primary = sets[0]
    run_stats = dict(run_stats)
    _, seq_lens, per_call = ran[primary]
    if per_call is not None:
        run_stats["tokens_per_call"] = per_call
        run_stats["seq_lens"] = list(seq_lens)
    try:
        fids = {
            name: fidelity(reference[name], outs, labels if name == primary else None)
            for name, (outs, _, _) in ran.items()
        }
    except LatencyLabError as exc:
        return result_of(cand, "failed", str(exc))
    measures = tuple(SetMeasure(name, fids[name], (), ran[name][1], ran[name][2]) for name in sets)
    if is_baseline:
        status, why = "baseline", "reference"
    else:
        status, why = "inside-budget", "inside budget"
        for name in sets:
            ok, why_set = budget.check(fids[name])
            if not ok:
                status, why = "outside-budget", why_set if len(sets) == 1 else f"{name}: {why_set}"
                break
    return result_of(cand, status, why, fidelity=fids[primary], build_s=build_s, stats=run_stats, sets=measures)


def search(
    ctx: BuildContext,
    candidates: Sequence[Candidate],
    budget: Budget,
    rounds: int = 10,
    per_round: int = 10,
    short_rounds: int = 2,
    time_budget_s: float | None = None,
    progress: ProgressFn | None = None,
    keep: Sequence[str] = (),
    clock: Clock | None = None,
) -> SearchResult:
    """Build, check and time every candidate; the first is the baseline.

    Every candidate runs every held-out input set (``ctx.input_sets()``); it is inside the budget only if
    it is inside on each. ``time_budget_s`` caps the build phase: candidates left when it is spent are
    reported as skipped by the cap, except those named in ``keep`` (the references the summary's split
    needs). The choice must be significantly faster than the baseline on every set; among those, the
    lowest geometric mean of its p50 ratios to the baseline wins.
    """
    if not candidates:
        raise LatencyLabError("no candidates to search")
    clk = clock or PerfCounterClock()
    t_start = now_ns(clk)
    sets = held_out_sets(ctx)
    labels = ctx.adapter.labels()
    total = len(candidates) + 1
    results: dict[str, CandidateResult] = {}
    runners: dict[str, Runner] = {}
    reference: dict[str, np.ndarray] = {}

    def over_time() -> bool:
        return time_budget_s is not None and (now_ns(clk) - t_start) / 1e9 > time_budget_s

    for i, cand in enumerate(candidates):
        if progress is not None:
            progress(f"building {cand.name}", i, total)
        why = cand.skip_reason(ctx)  # first: a candidate that cannot run here says why, not "time cap"
        if why:
            if i == 0:
                raise LatencyLabError(f"the baseline {cand.name} cannot run here: {why}")
            results[cand.name] = result_of(cand, "skipped", why)
            continue
        if i > 0 and cand.name not in keep and over_time():
            results[cand.name] = result_of(cand, "skipped", TIME_CAP_REASON)
            continue
        t0 = now_ns(clk)
        try:
            runner = cand.build(ctx)
            ran = run_sets(runner, sets)
        except Exception as exc:  # a failed variant is reported, the search goes on
            if i == 0:
                raise LatencyLabError(f"the baseline {cand.name} failed: {type(exc).__name__}: {exc}") from exc
            results[cand.name] = failed_build(cand, exc)
            continue
        build_s = (now_ns(clk) - t0) / 1e9
        if i == 0:
            reference = {name: outs for name, (outs, _, _) in ran.items()}
        stats = dict(getattr(runner, "stats", {}) or {})
        results[cand.name] = judge(cand, i == 0, ran, build_s, stats, reference, budget, labels)
        if results[cand.name].status == "failed":
            with contextlib.suppress(Exception):
                runner.close()
        else:
            runners[cand.name] = runner
    return finish(ctx, candidates, budget, results, runners, rounds, per_round, short_rounds, progress, clk, t_start)


def held_out_sets(ctx: BuildContext) -> dict[str, list[Feed]]:
    """``ctx.input_sets()``, an adapter's refusal as a one-line error."""
    try:
        return ctx.input_sets()
    except ValueError as exc:
        raise LatencyLabError(str(exc)) from None


def finish(
    ctx: BuildContext,
    candidates: Sequence[Candidate],
    budget: Budget,
    results: dict[str, CandidateResult],
    runners: dict[str, Runner],
    rounds: int,
    per_round: int,
    short_rounds: int,
    progress: ProgressFn | None,
    clk: Clock,
    t_start: int,
) -> SearchResult:
    """The latency phase and the choice: interleaved rounds over ``runners`` (every built candidate; the
    long plan for the baseline and those inside the budget), then the Pareto front and the verdict. Closes
    every runner."""
    sets = held_out_sets(ctx)
    primary = next(iter(sets))
    kind = ctx.adapter.output_kind
    total = len(candidates) + 1
    if progress is not None:
        progress("timing (interleaved)", len(candidates), total)
    build_phase_s = (now_ns(clk) - t_start) / 1e9
    plan = {n: (rounds if results[n].status in ("baseline", "inside-budget") else short_rounds) for n in runners}
    samples = _measure_interleaved(runners, sets, plan, per_round, clk)
    for n, runner in runners.items():
        with contextlib.suppress(Exception):
            runner.close()
        r = results[n]
        timed = tuple(
            SetMeasure(m.name, m.fidelity, tuple(samples[n][m.name]), m.seq_lens, m.tokens_per_call) for m in r.sets
        )
        results[n] = dataclasses.replace(r, samples_ns=tuple(samples[n][primary]), sets=timed)

    baseline = candidates[0].name
    base = results[baseline]
    base_p50 = {m.name: m.p50_ns() for m in base.sets}
    best: tuple[float, str] | None = None
    for r in results.values():
        if r.status != "inside-budget" or not r.sets:
            continue
        if not all(_significantly_faster(m, base.sets[j]) for j, m in enumerate(r.sets)):
            continue
        ratios = [m.p50_ns() / b for m in r.sets if (b := base_p50[m.name])]  # type: ignore[operator]
        score = float(np.exp(np.mean(np.log(ratios))))
        if best is None or score < best[0]:
            best = (score, r.name)
    points = []
    for r in results.values():
        lat = r.latency()
        if lat is not None and r.status in ("baseline", "inside-budget", "outside-budget"):
            points.append((r.name, lat.at(0.5).value, _score(r.fidelity, kind)))
    if best is None:
        verdict = "no improvement found: no variant inside the budget is significantly faster than the baseline"
        chosen = None
    else:
        chosen = best[1]
        over = f", geometric mean over {len(sets)} input sets" if len(sets) > 1 else ""
        verdict = f"{chosen}: {1 / best[0]:.2f}x faster (p50) than {baseline}{over}, inside the budget"
    if progress is not None:
        progress("done", total, total)
    return SearchResult(
        baseline=baseline,
        chosen=chosen,
        verdict=verdict,
        budget=budget.text,
        candidates=tuple(results[c.name] for c in candidates),
        pareto=pareto_front(points),
        wall_s=(now_ns(clk) - t_start) / 1e9,
        sets=tuple(sets),
        build_phase_s=build_phase_s,
    )

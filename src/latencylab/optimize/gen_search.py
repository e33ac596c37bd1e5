"""The generative search: fidelity on held-out prompts and text, then TTFT/TPOT in interleaved rounds.

1. The baseline (FP32 eager, the first candidate) answers every held-out fidelity prompt greedily (up to
   ``tokens`` tokens, EOS honoured): its answers are the reference, its perplexity on the held-out text the
   reference perplexity.
2. Every other candidate is built (a failure is recorded, the search goes on) and scored
   (:class:`GenFidelity`): ``token_agreement`` (per prompt, the share of the reference answer it reproduces
   before its first different token, mean over prompts), ``exact`` (share of answers identical), ``top1``
   (teacher-forced next-token top-1 agreement with the reference answers), ``ppl_delta`` (its perplexity
   on the held-out text over the reference's, minus 1). A candidate exact by construction (greedy
   speculative decoding of the FP32 model) still answers every prompt (the check that it is), and shares
   the FP32 model's logits, so its top-1 and perplexity are the baseline's.
3. Latency: ``rounds`` rounds; in each, for each timing prompt, every live candidate generates exactly
   ``tokens`` tokens (EOS ignored: equal work), in an order rotated per prompt and round. TTFT = the
   prefill (start to first token); TPOT = decode time / (tokens - 1). The headline is the **TPOT at equal
   work**: the decode time summed over all timed requests / the decode tokens, and its speed-up is the
   baseline's over the candidate's.
4. The choice: the lowest equal-work TPOT inside the budget, at the baseline's thread count, whose paired
   TPOT ratios to the baseline (same round, same prompt) have a 95% bootstrap CI of their geometric mean
   wholly below 1. None: "no improvement found". A candidate with more threads is reported (its gain is
   the threads') but not chosen: it spends more cores than the baseline.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.gen_candidates import GenCandidate, GenContext, GenRun, GenRunner, build, set_threads
from latencylab.timing import now_ns, rotated

DEFAULT_GEN_BUDGET = "ppl_delta<=2%,token_agreement>=0.95"
_TERM = re.compile(r"^\s*(token_agreement|top1|exact|ppl_delta)\s*(>=|<=)\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*$")
_DIRECTION = {"token_agreement": ">=", "top1": ">=", "exact": ">=", "ppl_delta": "<="}
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class GenBudget:
    """A conjunction of bounds, e.g. ``ppl_delta<=2%,token_agreement>=0.95``; agreements lie in [0, 1],
    ``ppl_delta`` (relative perplexity increase) is bounded from above by a value >= 0."""

    terms: tuple[tuple[str, str, float], ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> GenBudget:
        if not text.strip():
            raise LatencyLabError("the budget is empty: give e.g. ppl_delta<=2%,token_agreement>=0.95")
        terms = []
        for part in text.split(","):
            m = _TERM.match(part)
            if not m:
                raise LatencyLabError(
                    f"budget term {part.strip()!r} is not understood for --workload gen: use token_agreement>=0.95, "
                    "top1>=0.98, exact>=0.9, ppl_delta<=2%"
                )
            metric, op = m.group(1), m.group(2)
            value = float(m.group(3)) / (100.0 if m.group(4) else 1.0)
            if op != _DIRECTION[metric]:
                raise LatencyLabError(
                    f"budget term {part.strip()!r} bounds {metric} from the wrong side (use {_DIRECTION[metric]})"
                )
            if metric != "ppl_delta" and value > 1:
                raise LatencyLabError(f"budget term {part.strip()!r} can never be met: {metric} lies in [0, 1]")
            terms.append((metric, op, value))
        return cls(tuple(terms), text)

    def check(self, f: GenFidelity) -> tuple[bool, str]:
        for metric, op, bound in self.terms:
            v = f.value(metric)
            if math.isnan(v):
                return False, f"{metric} not measured"
            if not (v >= bound if op == ">=" else v <= bound):
                shown = f"{100 * v:+.2f}%" if metric == "ppl_delta" else f"{v:.4f}"
                lim = f"{100 * bound:g}%" if metric == "ppl_delta" else f"{bound:g}"
                return False, f"{metric} {shown} {'<' if op == '>=' else '>'} {lim}"
        return True, "inside budget"


@dataclass(frozen=True, slots=True)
class GenFidelity:
    """A candidate against the FP32 reference (fractions 0-1; perplexities exp of the mean NLL)."""

    token_agreement: float
    exact: float
    top1: float
    perplexity: float
    reference_perplexity: float
    tokens: int  # N: the answers compared are the first N tokens
    prompts: int
    by_construction: bool = False  # exact by construction (the FP32 model's greedy output)

    @property
    def ppl_delta(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0

    def value(self, metric: str) -> float:
        return float(getattr(self, metric))

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["ppl_delta"] = self.ppl_delta
        return d


def _prefix_share(got: Sequence[int], want: Sequence[int]) -> float:
    k = 0
    while k < min(len(got), len(want)) and got[k] == want[k]:
        k += 1
    return k / len(want) if want else 1.0


def score(
    runner: GenRunner, ctx: GenContext, ref: Sequence[tuple[int, ...]], ref_ppl: float, tokens: int, exact: bool,
    base: GenFidelity | None = None,
) -> GenFidelity:  # fmt: skip
    """``runner`` against the reference answers ``ref`` (module docstring); ``base``: the baseline's score,
    whose top-1 and perplexity a candidate exact by construction shares."""
    from latencylab.workloads.gen_fidelity import forced_agreement, perplexity

    prompts = ctx.inputs.fidelity_prompts
    got = [runner.generate(p, tokens, ctx.inputs.eos).tokens for p in prompts]
    shares = [_prefix_share(g, w) for g, w in zip(got, ref, strict=True)]
    same = sum(int(tuple(g) == tuple(w)) for g, w in zip(got, ref, strict=True))
    if exact and base is not None:
        top1, ppl = base.top1, base.perplexity
    elif getattr(runner, "model", None) is None:  # a model in another process (a peer server): its tokens only
        top1 = ppl = math.nan
    else:
        top1 = forced_agreement(runner.model, prompts, ref)
        ppl = perplexity(runner.model, ctx.inputs.texts)
    return GenFidelity(sum(shares) / len(shares), same / len(prompts), top1, ppl, ref_ppl, tokens, len(prompts), exact)


@dataclass(frozen=True, slots=True)
class GenCandidateResult:
    name: str
    family: str
    params: dict[str, Any]
    description: str
    exact: bool
    status: str  # baseline | inside-budget | outside-budget | skipped | failed
    reason: str
    fidelity: GenFidelity | None = None
    ttft_ns: tuple[int, ...] = ()  # one per timed request, in (round, prompt) order
    tpot_ns: tuple[float, ...] = ()
    decode_ns: int = 0  # summed over the timed requests
    decode_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    build_s: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tpot_equal_work_ms(self) -> float | None:
        return self.decode_ns / self.decode_tokens / 1e6 if self.decode_tokens else None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name, "family": self.family, "params": self.params, "description": self.description,
            "exact_by_construction": self.exact, "status": self.status, "reason": self.reason,
            "fidelity": None if self.fidelity is None else self.fidelity.to_dict(), "build_s": self.build_s,
            "stats": self.stats, "n": len(self.tpot_ns), "tpot_ms": self.tpot_equal_work_ms,
        }  # fmt: skip
        if self.tpot_ns:
            t, f = np.asarray(self.tpot_ns) / 1e6, np.asarray(self.ttft_ns) / 1e6
            d |= {"tpot_p50_ms": float(np.quantile(t, 0.5)), "tpot_p99_ms": float(np.quantile(t, 0.99)),
                  "ttft_p50_ms": float(np.quantile(f, 0.5)), "ttft_p99_ms": float(np.quantile(f, 0.99)),
                  "tpot_samples_ms": t.tolist(), "ttft_samples_ms": f.tolist()}  # fmt: skip
        if self.steps:
            d |= {"acceptance": self.accepted / self.proposed if self.proposed else None,
                  "tokens_per_step": self.decode_tokens / self.steps}  # fmt: skip
        return d


@dataclass(frozen=True, slots=True)
class GenSearchResult:
    baseline: str
    chosen: str | None
    verdict: str
    budget: str
    candidates: tuple[GenCandidateResult, ...]
    speedups: Mapping[str, Mapping[str, float]]  # name -> tpot (equal work), geomean, ci_low, ci_high, ttft
    wall_s: float
    tokens: int
    rounds: int

    def by_name(self, name: str) -> GenCandidateResult:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)


def paired_ratio_ci(ratios: Sequence[float], n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of ``ratios`` and its 95% percentile-bootstrap CI."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    gm = float(np.exp(logs.mean()))
    if logs.size < 2:
        return gm, gm, gm
    idx = np.random.default_rng(seed).integers(0, logs.size, size=(n_boot, logs.size))
    means = logs[idx].mean(axis=1)
    return gm, float(np.exp(np.quantile(means, 0.025))), float(np.exp(np.quantile(means, 0.975)))


def search(
    ctx: GenContext,
    candidates: Sequence[GenCandidate],
    budget: GenBudget,
    tokens: int = 24,
    rounds: int = 2,
    time_budget_s: float | None = None,
    progress: ProgressFn | None = None,
    builder: Callable[[GenContext, Mapping[str, Any]], GenRunner] = build,
) -> GenSearchResult:
    """Build, score and time every candidate, the first being the baseline (module docstring)."""
    if not candidates:
        raise LatencyLabError("no candidates to search")
    if tokens < 2:
        raise LatencyLabError("gen search: tokens must be >= 2 (TPOT needs two tokens)")
    clk = ctx.clock
    t_start = now_ns(clk)
    total = len(candidates) + 1
    results: dict[str, GenCandidateResult] = {}
    runners: dict[str, GenRunner] = {}
    ref: list[tuple[int, ...]] = []
    base_fid: GenFidelity | None = None
    for i, cand in enumerate(candidates):
        if progress is not None:
            progress(f"building {cand.name}", i, total)
        mk = _maker(cand)
        if cand.skip:
            if i == 0:
                raise LatencyLabError(f"the baseline {cand.name} cannot run: {cand.skip}")
            results[cand.name] = mk("skipped", cand.skip)
            continue
        if i > 0 and time_budget_s is not None and (now_ns(clk) - t_start) / 1e9 > time_budget_s:
            results[cand.name] = mk("skipped", "time budget spent (cut by the search's time cap)")
            continue
        t0 = now_ns(clk)
        try:
            runner = builder(ctx, cand.params)
            if i == 0:
                from latencylab.workloads.gen_fidelity import perplexity

                ref = [runner.generate(p, tokens, ctx.inputs.eos).tokens for p in ctx.inputs.fidelity_prompts]
                ppl = perplexity(runner.model, ctx.inputs.texts)
                base_fid = GenFidelity(1.0, 1.0, 1.0, ppl, ppl, tokens, len(ref), True)
                fid = base_fid
            else:
                assert base_fid is not None
                fid = score(runner, ctx, ref, base_fid.perplexity, tokens, cand.exact, base_fid)
        except Exception as exc:  # a failed variant is reported, the search goes on
            if i == 0:
                raise LatencyLabError(f"the baseline {cand.name} failed: {type(exc).__name__}: {exc}") from exc
            msg = (str(exc).strip().splitlines() or [""])[0]
            results[cand.name] = mk("failed", f"build failed: {type(exc).__name__}: {msg}"[:300])
            continue
        build_s = (now_ns(clk) - t0) / 1e9
        if i == 0:
            status, why = "baseline", "reference"
        else:
            ok, why = budget.check(fid)
            status = "inside-budget" if ok else "outside-budget"
            if ok and cand.exact:
                why = "inside budget (exact by construction: the FP32 model's greedy output)"
            if ok and fid.by_construction and fid.exact < 1.0:  # a lossless method that was not: say so loudly
                why = f"exact by construction, yet {fid.exact:.2f} of the answers are identical (float ties?)"
        results[cand.name] = mk(status, why, fidelity=fid, build_s=build_s, stats=dict(runner.stats))
        runners[cand.name] = runner

    if progress is not None:
        progress("timing (interleaved)", len(candidates), total)
    timed = _time(runners, ctx, tokens, rounds)
    set_threads(ctx.threads)  # a thread-count candidate ran last, perhaps: the process gets the baseline's back
    for n, runner in runners.items():
        live = getattr(runner, "live_stats", None)  # a compiled step's recompiles happen while it is timed
        stats = live() if live is not None else results[n].stats
        runner.close()
        results[n] = dataclasses.replace(results[n], stats=stats, **timed[n])
    base = results[candidates[0].name]
    speedups, chosen, best = _choose(results, base, ctx.threads)
    for name, r in results.items():
        if name in speedups and name not in (base.name, chosen):
            results[name] = dataclasses.replace(r, reason=_why_not(r, speedups[name], ctx.threads))
    if chosen is None:
        verdict = "no improvement found: no variant inside the budget has a TPOT significantly below the baseline's"
    else:
        verdict = f"{chosen}: {1 / best:.2f}x faster TPOT (equal work) than {base.name}, inside the budget"
    if progress is not None:
        progress("done", total, total)
    return GenSearchResult(
        base.name, chosen, verdict, budget.text, tuple(results[c.name] for c in candidates), speedups,
        (now_ns(clk) - t_start) / 1e9, tokens, rounds,
    )  # fmt: skip


def _maker(cand: GenCandidate) -> Callable[..., GenCandidateResult]:
    def mk(status: str, reason: str, **kw: Any) -> GenCandidateResult:
        return GenCandidateResult(
            cand.name, cand.family, dict(cand.params), cand.description, cand.exact, status, reason, **kw
        )

    return mk


def _time(runners: Mapping[str, GenRunner], ctx: GenContext, tokens: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Interleaved rounds (module docstring, 3): per candidate, the fields of its timed requests."""
    names = list(runners)
    prompts = ctx.inputs.timing_prompts
    for n in names:  # warm-up: one short request each, untimed
        runners[n].generate(prompts[0][:32], 3)
    runs: dict[str, list[GenRun]] = {n: [] for n in names}
    for r in range(rounds):
        for j, p in enumerate(prompts):
            for n in rotated(names, r * len(prompts) + j):
                runs[n].append(runners[n].generate(p, tokens))
    out = {}
    for n, rs in runs.items():
        out[n] = {
            "ttft_ns": tuple(x.ttft_ns for x in rs),
            "tpot_ns": tuple(x.decode_ns / (len(x.tokens) - 1) for x in rs),
            "decode_ns": sum(x.decode_ns for x in rs),
            "decode_tokens": sum(len(x.tokens) - 1 for x in rs),
            "proposed": sum(x.proposed for x in rs),
            "accepted": sum(x.accepted for x in rs),
            "steps": sum(x.steps for x in rs),
        }
    return out


def _why_not(r: GenCandidateResult, sp: Mapping[str, float], threads: int) -> str:
    """A measured candidate that was not chosen: its fidelity reason, then what its speed says."""
    speed = (
        f"TPOT {sp['tpot']:.2f}x the baseline's (paired ratio CI [{sp['ratio_ci_low']:.2f}, {sp['ratio_ci_high']:.2f}])"
    )
    n = int(r.params.get("threads", threads))
    if r.status != "inside-budget":
        return f"{r.reason}; {speed}"
    if n != threads:
        return f"{r.reason}; {speed}, but with {n} threads (the baseline has {threads}): not chosen at equal cores"
    if sp["ratio_ci_high"] >= 1.0:
        return f"{r.reason}; {speed}: not significantly faster"
    return f"{r.reason}; {speed}: a faster one was chosen"


def _choose(
    results: Mapping[str, GenCandidateResult], base: GenCandidateResult, threads: int
) -> tuple[dict[str, dict[str, float]], str | None, float]:
    speedups: dict[str, dict[str, float]] = {}
    chosen, best = None, math.inf
    b_tpot, b_ttft = base.tpot_equal_work_ms, np.median(base.ttft_ns) if base.ttft_ns else None
    for r in results.values():
        if not r.tpot_ns or not b_tpot or not r.tpot_equal_work_ms:  # None, or no time on the clock: no ratio
            continue
        gm, lo, hi = paired_ratio_ci([a / b for a, b in zip(r.tpot_ns, base.tpot_ns, strict=True)])
        speedups[r.name] = {
            "tpot": b_tpot / r.tpot_equal_work_ms, "ratio_geomean": gm, "ratio_ci_low": lo, "ratio_ci_high": hi,
            "ttft": float(b_ttft / np.median(r.ttft_ns)) if b_ttft else math.nan,
        }  # fmt: skip
        same_threads = int(r.params.get("threads", threads)) == threads
        if r.status == "inside-budget" and same_threads and hi < 1.0:
            ratio = r.tpot_equal_work_ms / b_tpot
            if ratio < best:
                chosen, best = r.name, ratio
    return speedups, chosen, best

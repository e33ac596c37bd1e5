"""Rules over ``optimize --workload gen`` results (kind ``optimize-gen``), from the document's own evidence.

* ``gen-faster-rejected``: candidates significantly faster than the choice (or than FP32 when nothing was
  chosen) that the fidelity budget rejected: their speed-up, the budget term they failed.
* ``gen-no-choice``: nothing chosen; the fastest candidate inside the budget and its paired CI.
* ``gen-spec-acceptance-low``: a speculative candidate whose draft tokens are accepted less than
  ``ACCEPT_LOW`` of the time (a warning when it is also no faster than FP32).
* ``gen-choice-ttft-slower``: the choice's TTFT is ``TTFT_SLOWER`` or more slower than FP32's.
* ``gen-recipe-not-reproduced``: a ``--recipe`` re-measurement slower than FP32, or whose speed-up fell below
  ``REPRODUCED`` of the recorded one.
* ``gen-not-measured``: candidates whose build failed, or that the search's time cap cut.

A candidate is *significantly* faster when the 95% CI of its paired TPOT ratios to the baseline lies wholly
below 1 (the search's own test, :mod:`latencylab.optimize.gen_search`).
"""

from __future__ import annotations

from collections.abc import Sequence

from latencylab.diagnose.rules.common import of_kind
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult
from latencylab.results.optimize_gen import GenCandidateRow, OptimizeGenResult

ACCEPT_LOW = 0.5  # accepted / proposed draft tokens
TTFT_SLOWER = 0.9  # the choice's TTFT speed-up below this: >= ~10% slower first token
REPRODUCED = 0.8  # a recipe's reproduced speed-up below this share of the recorded one
KIND = "optimize-gen"


def _significant(r: GenCandidateRow) -> bool:
    return r.ratio_ci_high is not None and r.ratio_ci_high < 1.0


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _failed_term(r: GenCandidateRow) -> str:
    return r.reason.split(";")[0].strip() or r.status


def _faster_rejected(res: OptimizeGenResult, source: str) -> list[Finding]:
    bar = res.row(res.chosen).speedup_tpot if res.chosen else 1.0
    rej = [r for r in res.rows if r.status == "outside-budget" and r.speedup_tpot is not None and _significant(r)]
    rej = sorted(
        (r for r in rej if bar is not None and (r.speedup_tpot or 0.0) > bar), key=lambda r: -(r.speedup_tpot or 0)
    )
    if not rej:
        return []
    top = rej[0]
    than = f"the choice {res.chosen} ({_x(bar)})" if res.chosen else f"FP32 ({res.baseline})"
    ev = []
    for r in rej:
        ev.append(Evidence(f"{r.name}: TPOT speed-up at equal work", round(r.speedup_tpot or 0.0, 3), "x"))
        ev.append(Evidence(f"{r.name}: outside the budget", _failed_term(r)))
    ev.append(Evidence("budget", res.budget))
    tried = [r.name for r in res.rows if r.measured and any(k in r.name for k in ("keep", "screen", "smooth"))]
    advice = (
        "the speed is there, the fidelity is not: keep the layers the sensitivity ranking names in float "
        "(the -keep / -screen variants), smooth the activations before INT8 (int8-smooth), or check on the task "
        "itself whether the budget is stricter than it needs to be; loosen it only on that evidence"
    )
    if tried:
        advice += f" (this search measured {len(tried)} such variant(s): {', '.join(tried)})"
    return [
        Finding(
            rule="gen-faster-rejected",
            severity="info" if res.chosen else "warning",
            title=(
                f"{len(rej)} candidate(s) faster than {than} were rejected by the fidelity budget: the fastest, "
                f"{top.name}, is {_x(top.speedup_tpot)} with {_failed_term(top)}"
            ),
            evidence=tuple(ev),
            recommendation=advice,
            source=source,
            details={"rejected": [r.name for r in rej], "bar": bar},
        )
    ]


def _no_choice(res: OptimizeGenResult, source: str) -> list[Finding]:
    if res.chosen is not None:
        return []
    inside = [r for r in res.rows if r.status == "inside-budget" and r.speedup_tpot is not None]
    ev = [Evidence("candidates measured inside the budget", len(inside)),
          Evidence("candidates measured outside it", sum(r.status == "outside-budget" for r in res.rows))]  # fmt: skip
    if inside:
        best = max(inside, key=lambda r: r.speedup_tpot or 0.0)
        ci = "-"
        if best.ratio_ci_low and best.ratio_ci_high:
            ci = f"[{1 / best.ratio_ci_high:.2f}x, {1 / best.ratio_ci_low:.2f}x]"
        ev += [
            Evidence(f"fastest inside: {best.name}, TPOT speed-up", round(best.speedup_tpot or 0.0, 3), "x"),
            Evidence(f"{best.name}: 95% CI of the speed-up (paired)", ci),
            Evidence(f"{best.name}: why not chosen", best.reason),
        ]
        advice = (
            f"{best.name} is the fastest inside the budget but not chosen ({best.reason.split('; ')[-1]}): if its "
            "gain is real, more --rounds narrow the CI; a gain that needs more threads is the threads', not the "
            "variant's"
        )
    else:
        advice = "no candidate was measured inside the budget: see which term each one failed in the table"
    return [
        Finding(
            rule="gen-no-choice",
            severity="warning",
            title=f"no variant chosen: none inside the budget ({res.budget}) has a TPOT significantly below FP32's",
            evidence=tuple(ev),
            recommendation=advice,
            source=source,
        )
    ]


def _spec_low(res: OptimizeGenResult, source: str) -> list[Finding]:
    low = [r for r in res.rows if r.acceptance is not None and r.acceptance < ACCEPT_LOW]
    if not low:
        return []
    slow = [r for r in low if r.speedup_tpot is not None and r.speedup_tpot <= 1.0]
    top = min(low, key=lambda r: r.acceptance or 0.0)
    ev = []
    for r in low:
        ev.append(Evidence(f"{r.name}: draft tokens accepted", round(100 * (r.acceptance or 0.0), 1), "%"))
        if r.tokens_per_step is not None:
            ev.append(Evidence(f"{r.name}: tokens per verify step", round(r.tokens_per_step, 3)))
        if r.speedup_tpot is not None:
            ev.append(Evidence(f"{r.name}: TPOT speed-up at equal work", round(r.speedup_tpot, 3), "x"))
    return [
        Finding(
            rule="gen-spec-acceptance-low",
            severity="warning" if slow else "info",
            title=(
                f"speculative decoding accepts few draft tokens: {top.name} {100 * (top.acceptance or 0):.0f}% "
                f"(below {ACCEPT_LOW:.0%})" + (f"; {len(slow)} of them no faster than FP32" if slow else "")
            ),
            evidence=tuple(ev),
            recommendation=(
                "each verify step runs the target model for about one token when most drafts are rejected: propose "
                "fewer tokens (smaller k), use a draft that agrees more with the target (a lookup draft only helps "
                "outputs that repeat the prompt), or leave speculation out for this workload"
            ),
            source=source,
            details={"low": [r.name for r in low], "slow": [r.name for r in slow]},
        )
    ]


def _ttft_slower(res: OptimizeGenResult, source: str) -> list[Finding]:
    if res.chosen is None:
        return []
    c = res.row(res.chosen)
    if c.speedup_ttft is None or c.speedup_ttft >= TTFT_SLOWER:
        return []
    b = res.row(res.baseline) if res.baseline else None
    ev = [Evidence(f"{c.name}: TTFT speed-up (median)", round(c.speedup_ttft, 3), "x"),
          Evidence(f"{c.name}: TPOT speed-up at equal work", round(c.speedup_tpot or 0.0, 3), "x")]  # fmt: skip
    if c.ttft_p50_ms is not None and b is not None and b.ttft_p50_ms is not None:
        ev += [Evidence(f"{c.name}: TTFT p50", round(c.ttft_p50_ms, 3), "ms"),
               Evidence(f"{b.name}: TTFT p50", round(b.ttft_p50_ms, 3), "ms")]  # fmt: skip
    return [
        Finding(
            rule="gen-choice-ttft-slower",
            severity="warning",
            title=(
                f"the choice {c.name} decodes {_x(c.speedup_tpot)} faster, but its first token comes "
                f"{_x(c.speedup_ttft)} as fast as FP32's"
            ),
            evidence=tuple(ev),
            recommendation=(
                "the search chooses on TPOT; when the first token matters (short answers, interactive use), serve "
                "the prefill with the faster model or weigh TTFT in the choice"
            ),
            source=source,
        )
    ]


def _recipe(res: OptimizeGenResult, source: str) -> list[Finding]:
    rec = res.recipe_check
    if rec is None:
        return []
    was, now = (rec.get("recorded") or {}), (rec.get("reproduced") or {})
    a, b = was.get("speedup_tpot"), now.get("speedup_tpot")
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return []
    if b >= 1.0 and b >= REPRODUCED * a:
        return []
    ev = [
        Evidence("recorded TPOT speed-up", round(float(a), 3), "x"),
        Evidence("reproduced now", round(float(b), 3), "x"),
    ]
    for k in ("token_agreement", "ppl_delta"):
        if was.get(k) != now.get(k):
            ev.append(Evidence(f"{k}: recorded / now", f"{was.get(k)} / {now.get(k)}"))
    ev += [Evidence("--force", m) for m in rec.get("forced") or []]
    what = "is now slower than FP32" if b < 1.0 else f"reproduced {b / a:.0%} of its recorded speed-up"
    return [
        Finding(
            rule="gen-recipe-not-reproduced",
            severity="warning",
            title=f"the recipe's variant {now.get('name', '?')} {what} ({_x(float(b))} vs {_x(float(a))} recorded)",
            evidence=tuple(ev),
            recommendation=(
                "the machine, its load or its thread count differ from the search's: check the env of both results "
                "(latencylab env), re-run the search here, and serve the variant only if it is faster on this machine"
            ),
            source=source,
        )
    ]


def _not_measured(res: OptimizeGenResult, source: str) -> list[Finding]:
    failed = [r for r in res.rows if r.status == "failed"]
    cut = [r for r in res.rows if r.status == "skipped" and "time budget" in r.reason]
    if not failed and not cut:
        return []
    ev = [Evidence(f"{r.name}: failed", r.reason) for r in failed]
    ev += [Evidence(f"{r.name}: cut", r.reason) for r in cut]
    parts = ([f"{len(failed)} failed to build"] if failed else []) + (
        [f"{len(cut)} cut by the time cap"] if cut else []
    )
    return [
        Finding(
            rule="gen-not-measured",
            severity="info",
            title=f"{len(failed) + len(cut)} candidate(s) of the search were not measured: {', '.join(parts)}",
            evidence=tuple(ev),
            recommendation=(
                "the choice was made without them: fix the failure the reason names, or give the search more time "
                "(--time-budget) or fewer candidates (--only)"
            ),
            source=source,
            details={"failed": [r.name for r in failed], "cut": [r.name for r in cut]},
        )
    ]


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r in of_kind(results, KIND):
        res = r.result()
        assert isinstance(res, OptimizeGenResult)
        for check in (_faster_rejected, _no_choice, _spec_low, _ttft_slower, _recipe, _not_measured):
            out.extend(check(res, r.source))
    return out

"""The capacity search's refine phase: interleaved rounds over a grid of rates, judged on a monotone fit.

The bisection of ``search_capacity`` runs its steps one after another, each judged alone. On a host whose speed
moves by 20-30% within minutes (a shared VM: the server's fixed work per request, its JPEG decode, was 1.11 ms in
one step and 1.45 ms two minutes later, with no steal to show it; issue 22), the step that decides the bracket may
fall in a fast phase and its neighbour in a slow one, so the answer depends on which steps met which phase; and
near capacity a shedding server's curve is flat (0.4-0.8% shed from 240 to 360 req/s, then 19% at 375), so one
step's binomial noise decides where it ends. The refine phase removes both sources:

* **A grid** of rates in steps of ``precision`` around the bracket the bisection found (``refine_below`` steps below
  its passing rate, up to ``refine_above`` steps above its failing one).
* **Interleaved rounds.** Each round runs one chunk at every grid rate, in ascending order (each chunk follows the
  same lower rate in every round, so a server's adaptive state enters each rate from the same path), with
  ``cooldown_s`` of idle before each round. ``refine_rounds`` rounds: every rate is measured in every phase the
  host went through, so a slow minute is shared by all rates instead of deciding one.
* **A monotone fit.** Per rate, the fraction of ok requests over the SLO threshold (or flagged as missing their
  objectives) and the fraction shed or failed are pooled over the rounds; each is fitted non-decreasing in the
  rate (isotonic regression, weighted by the requests: the pool-adjacent-violators algorithm), which pools a
  noisy rate with its neighbours exactly where the raw fractions disagree with the order the physics imposes.
  The capacity is the highest grid rate whose fitted fractions are within the SLO's allowance (``1 - q``) and
  the shed allowance (``max_error_fraction``); the fits being monotone, every lower grid rate passes too.

The fit is a point estimate of where the curve crosses, not a hypothesis test: its reproducibility comes from
the data it pools (every rate x every round), and it is reported with each rate's raw and fitted fractions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latencylab.load.capacity import MeasureFn, SearchConfig
    from latencylab.load.results import Slo


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators). An entry of zero
    weight carries no information: it is left out of the fit and comes back NaN."""
    if len(values) != len(weights):
        raise ValueError("values and weights differ in length")
    if any(w < 0 or math.isnan(w) for w in weights):
        raise ValueError("weights must be >= 0")
    idx = [i for i, w in enumerate(weights) if w > 0]
    blocks: list[list[float]] = []  # [weighted mean, weight, entries]
    for i in idx:
        blocks.append([float(values[i]), float(weights[i]), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            w = a[1] + b[1]
            a[0], a[1], a[2] = (a[0] * a[1] + b[0] * b[1]) / w, w, a[2] + b[2]
    fitted = [m for m, _, n in blocks for _ in range(int(n))]
    out = [math.nan] * len(values)
    for i, f in zip(idx, fitted, strict=True):
        out[i] = f
    return out


def grid(lo: float, top: float, precision: float, below: int, above: int, max_rate: float) -> list[float]:
    """Rates in geometric steps of ``precision``: ``below`` steps under ``lo`` up to ``above`` steps over ``top``."""
    if not (0 < lo < top):
        raise ValueError("need 0 < lo < top")
    step = 1.0 + precision
    rates = [lo * step**k for k in range(-below, 0)] + [lo]
    while rates[-1] < top * step**above * (1 - 1e-9) and rates[-1] * step <= max_rate:
        rates.append(rates[-1] * step)
    return [round(r, 3) for r in rates]


@dataclass(frozen=True, slots=True)
class Refined:
    capacity_rate: float | None  # highest grid rate within both allowances on the fits; None: not even the lowest
    goodput: float | None  # that rate's pooled goodput
    rows: tuple[dict[str, Any], ...]  # per rate measured, ascending: pooled figures, raw and fitted fractions
    reason: str


def refine_seed(seed: int, rate: float, round_: int) -> int:
    """Round ``round_`` at ``rate``: a sample of its own, never one of the bisection's chunks."""
    from latencylab.load.capacity import step_seed

    return step_seed(seed + 15_485_863 + 7919 * round_, rate)


def refine(
    measure: MeasureFn,
    slo: Slo,
    cfg: SearchConfig,
    seed: int,
    lo: float,
    top: float,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Refined:
    """The refine phase around the bisection's bracket (``lo`` passed, ``top`` failed): module docstring.

    Where the fit puts the capacity below the grid (the bracket came from a fast minute) or at its top (a slow
    one), a grid of the same span is measured below (above) it, at most twice, and the fit is redone over every
    rate measured: one fit over all the refine data, never the last grid alone."""
    from latencylab.load.capacity import _Pool

    pools: dict[float, _Pool] = {}
    invalid: dict[float, int] = {}
    grids: list[list[float]] = []
    rates = grid(lo, top, cfg.precision, cfg.refine_below, cfg.refine_above, cfg.max_rate)
    while True:
        grids.append(rates)
        _measure_grid(measure, slo, cfg, seed + 31 * (len(grids) - 1), rates, pools, invalid, on_chunk, sleep)
        cap, goodput, rows = _fit(pools, invalid, slo, cfg)
        if len(grids) > 2:
            break
        low, high = min(pools), max(pools)
        if cap is None and low > cfg.start_rate / 64:
            rates = grid(low / (1 + cfg.refine_bracket), low, cfg.precision, cfg.refine_below, 0, cfg.max_rate)[:-1]
        elif cap == high and high < cfg.max_rate:
            top_ = min(high * (1 + cfg.refine_bracket), cfg.max_rate)
            rates = grid(high, top_, cfg.precision, 0, cfg.refine_above, cfg.max_rate)[1:]
        else:
            break
        if not rates:
            break
    spans = "; ".join(f"{len(g)} rates {g[0]:g}-{g[-1]:g}/s" for g in grids)
    span = f"{spans} x {cfg.refine_rounds} interleaved rounds"
    rates_all = sorted(pools)
    if cap is None:
        reason = f"refined over {span}: even the lowest rate is over an allowance on the monotone fit"
    elif cap == rates_all[-1]:
        reason = f"refined over {span}: every rate within the allowances on the monotone fit (at least {cap:g}/s)"
    else:
        nxt = rates_all[rates_all.index(cap) + 1]
        reason = f"refined over {span}: within the allowances on the monotone fit up to {cap:g}/s, over at {nxt:g}/s"
    return Refined(cap, goodput, rows, reason)


def _measure_grid(
    measure: MeasureFn, slo: Slo, cfg: SearchConfig, seed: int, rates: list[float], pools: dict[float, Any],
    invalid: dict[float, int], on_chunk: Callable[[dict[str, Any]], None] | None,
    sleep: Callable[[float], None] | None,
) -> None:  # fmt: skip
    """``cfg.refine_rounds`` rounds over ``rates`` (ascending, one chunk each), pooled into ``pools``."""
    from latencylab.load.capacity import _Pool

    for r in rates:
        pools.setdefault(r, _Pool(slo.threshold_ns))
        invalid.setdefault(r, 0)
    for rnd in range(cfg.refine_rounds):
        if cfg.cooldown_s > 0 and sleep is not None:
            sleep(cfg.cooldown_s)
        for r in rates:
            for attempt in range(cfg.invalid_retries + 1):
                seg = measure(r, cfg.chunk_s, refine_seed(seed, r, rnd) + 1_000_003 * attempt, None)
                usable = seg.usable(cfg.max_late_fraction, cfg.max_late_sends)
                if on_chunk is not None:
                    on_chunk({"phase": "refine", "offered_rate": r, "round": rnd + 1, "counted": usable})
                if usable:
                    if not seg.valid:
                        pools[r].late_kept += 1
                    pools[r].add(seg, cfg.warmup_s, cfg.chunk_s)
                    break
                invalid[r] += 1


def _fit(
    pools: dict[float, Any], invalid: dict[float, int], slo: Slo, cfg: SearchConfig
) -> tuple[float | None, float | None, tuple[dict[str, Any], ...]]:
    """The monotone fit over every rate measured: (the highest rate within both allowances, its goodput, the rows
    ascending)."""
    from latencylab.load.capacity import _judge

    rates = sorted(pools)
    ok_n = [sum(pools[r].block_ok) for r in rates]
    sent_n = [sum(pools[r].block_sent) for r in rates]
    # a rate where nothing succeeded: every request missed (over = 1), weighted by what was sent
    over = [
        sum(pools[r].block_late) / o if o else (1.0 if s else math.nan)
        for r, o, s in zip(rates, ok_n, sent_n, strict=True)
    ]
    fail = [sum(pools[r].block_failed) / s if s else math.nan for r, s in zip(rates, sent_n, strict=True)]
    over_fit = isotonic(over, [float(o) if o else float(s) for o, s in zip(ok_n, sent_n, strict=True)])
    fail_fit = isotonic(fail, [float(s) for s in sent_n])
    allow = 1.0 - slo.q
    rows: list[dict[str, Any]] = []
    capacity: float | None = None
    goodput: float | None = None
    for i, r in enumerate(rates):
        _, _, _, figures = _judge(pools[r], slo, cfg, True)
        fits = not math.isnan(over_fit[i]) and not math.isnan(fail_fit[i])  # NaN: no request measured there
        passed = fits and over_fit[i] <= allow + 1e-12 and fail_fit[i] <= cfg.max_error_fraction + 1e-12
        if passed:
            capacity, goodput = r, figures.get("goodput")
        rows.append({
            "phase": "refine", "offered_rate": r, **figures, "chunks": pools[r].chunks, "invalid_chunks": invalid[r],
            "late_chunks_kept": pools[r].late_kept, "early_stops": 0,
            "over_fraction": _num(over[i]), "over_fitted": _num(over_fit[i]),
            "failed_fraction": _num(fail[i]), "failed_fitted": _num(fail_fit[i]),
            "verdict": ("pass" if passed else "fail") if fits else "undecided", "passed": passed,
            "why": _why(over[i], over_fit[i], fail[i], fail_fit[i], allow, cfg.max_error_fraction, pools[r].flagged),
        })  # fmt: skip
    return capacity, goodput, tuple(rows)


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def _why(over: float, over_fit: float, fail: float, fail_fit: float, allow: float, max_fail: float, flag: bool) -> str:
    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.2%}"

    what = "missed an objective" if flag else "over the threshold"
    return (
        f"{pct(over)} of ok {what} (fitted {pct(over_fit)}, allowed {allow:.1%}), "
        f"{pct(fail)} shed or failed (fitted {pct(fail_fit)}, allowed {max_fail:.1%})"
    )

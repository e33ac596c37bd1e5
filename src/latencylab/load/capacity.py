"""Capacity search: the highest offered rate whose run meets a latency SLO.

Two searches live here.

``search_capacity`` (``latencylab load --find-capacity``, ``benchmarks/serve_overload.py``) is built to be
reproducible: repeated on the same machine and code its answer should move by a few percent, not by 2x.

* **Warm-up excluded.** One discarded run at the start rate before the first step (lazy imports, JIT,
  connection pools, the server's estimators), and the first ``warmup_s`` of every chunk (its queue starts
  empty) is left out of the verdict.
* **A statistical stopping rule per step.** A step at one rate runs in chunks of ``chunk_s`` seconds, each
  with its own arrival seed. After each chunk the pooled requests are judged twice: the SLO quantile of the
  successful requests (the order-statistic interval of that quantile against the threshold, i.e. a binomial
  test on the count over the threshold) and the shed + failed fraction against ``max_error_fraction``. Each
  test is decided only when the binomial tail over all requests *and* a batch-means t-test over 1-s blocks of
  intended send time agree (requests sharing a queue are not independent: one burst puts ten over together,
  which a binomial alone counts as ten witnesses). Pass when both tests pass; fail when either fails;
  otherwise *undecided*, and the step is extended by another chunk, up to ``max_chunks``; a step still
  undecided then is judged on its point estimates, and says so. A chunk the abort rule stopped (the SLO
  violated with confidence mid-chunk) fails its step at once only above ``early_stop_decisive`` x the
  highest passing rate; inside the bisection it is one observation among the step's chunks (a burst in one
  chunk failed a step 5% above the capacity another search found, issue 22), and a second one fails it.
* **Steps independent of the path.** ``cooldown_s`` of idle before each step lets a server's adaptive
  state (a learned admission margin, its slack) relax from the step before, which may have been at 2x.
* **Bracket, then bisect.** From ``start_rate`` the rate doubles until a step fails (halves until one passes),
  then the interval between the last passing and the first failing rate is bisected until it is within
  ``precision``.
* **Refine (optional, ``refine_rounds``).** The bisection stops at a coarser bracket and a grid of rates around
  it is measured in interleaved rounds and judged on a monotone fit (``latencylab.load.capacity_refine``): on a
  host whose speed moves within minutes, every rate sees every phase, and a flat curve's noise is pooled.
* **Repeats.** ``repeat_capacity`` runs K independent searches (their own seeds) and reports the median, the
  min-max and the spread (largest deviation from the median, relative), so a capacity is never quoted
  without its reproducibility.

The older single-run steps (``grid_capacity``, ``find_capacity``) are in ``latencylab.load.capacity_steps``.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.load.early_stop import MIN_BLOCKS, EarlyStop
from latencylab.load.generator import AbortFn, Records
from latencylab.load.results import LoadResult, Slo


@dataclass(frozen=True, slots=True)
class Capacity:
    slo: str
    capacity_rate: float | None  # highest passing offered rate
    goodput: float | None  # best goodput among passing steps
    steps: tuple[dict[str, Any], ...]  # the latency-vs-throughput curve, in the order run
    reason: str
    # True when the bracket's upper end is a rate the load generator could not keep (an invalid step, not a
    # failure of the server): ``capacity_rate`` is then only a lower bound
    generator_bound: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "capacity_rate": self.capacity_rate,
            "goodput": self.goodput,
            "reason": self.reason,
            "generator_bound": self.generator_bound,
            "steps": list(self.steps),
        }


def step_seed(seed: int, rate: float) -> int:
    """The arrival and payload seed of the step at ``rate``: the same for every server, different per rate.

    One seed for every rate replays one sample scaled in time, so one unlucky burst (six of the first sixteen
    texts among the longest, in the first half second) decides every step above the rate it overflows, for
    every server alike: a shared "wall" that belongs to the sample, not to any server.
    """
    return (seed * 1_000_003 + round(rate * 1000)) % 2**32


# -- the reproducible search ---------------------------------------------------------------------------------


def _generator_reason(reason: str) -> str:
    """An invalid reason without a distributed run's ``worker N (node): `` prefix (scaleout.merge)."""
    m = re.match(r"worker \d+ \([^)]*\): ", reason)
    return reason[m.end() :] if m else reason


@dataclass(frozen=True, slots=True)
class Segment:
    """One timed run at one offered rate, as the search judges it: per request, ns from the run's origin."""

    rate: float
    intended_ns: np.ndarray
    done_ns: np.ndarray
    outcome: np.ndarray  # 0 ok, 1 shed, 2 error
    valid: bool = True
    why_invalid: str = ""
    stopped_early: str = ""  # the abort rule's reason: the SLO was violated with confidence mid-run
    late_fraction: float = 0.0  # of sends more than 1 ms after their intended time (the generator's own error)
    late_only: bool = False  # invalid for that reason alone
    # Per request, whether it missed the objective (read for ok requests only). None: latency > the threshold.
    # A generative search (load.gen_capacity) sets it: a request is late when it missed any token objective.
    missed: np.ndarray | None = None

    @classmethod
    def from_run(cls, rate: float, result: LoadResult, rec: Records) -> Segment:
        s = result.summary
        reasons = list(s.get("invalid_reasons", []))
        return cls(
            rate, rec.intended_ns, rec.done_ns, rec.outcome, bool(s.get("valid", False)), "; ".join(reasons),
            str(s.get("stopped_early") or ""), float(s.get("late_fraction") or 0.0),
            bool(reasons) and all(_generator_reason(r).startswith("generator fell behind") for r in reasons),
        )  # fmt: skip

    @property
    def late_sends(self) -> int:
        """How many sends went out more than 1 ms late (from ``late_fraction`` of the chunk's requests)."""
        return round(self.late_fraction * len(self.intended_ns))

    def usable(self, max_late_fraction: float, max_late_sends: int = 0) -> bool:
        """Valid, or otherwise valid and late on at most ``max_late_fraction`` of its sends or on at most
        ``max_late_sends`` sends whatever their fraction: a late send's latency still counts from its intended
        time, so lateness can only make the step look worse, never better."""
        late_ok = self.late_fraction <= max_late_fraction or self.late_sends <= max_late_sends
        return self.valid or (self.late_only and late_ok)


# (offered rate, seconds, seed, abort rule or None) -> one run at that rate
MeasureFn = Callable[[float, float, int, AbortFn | None], Segment]


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How ``search_capacity`` measures (defaults: a quiet server with tens to hundreds of requests/s)."""

    start_rate: float = 10.0  # first step (req/s)
    max_rate: float = 100_000.0
    precision: float = 0.05  # stop bisecting when first failing / last passing - 1 <= this
    chunk_s: float = 8.0  # seconds of load per chunk (one look of the stopping rule, one observation)
    min_chunks: int = 3  # a verdict needs at least this many (the batch-means test's observations)
    max_chunks: int = 8  # an undecided step is extended up to this many chunks
    warmup_s: float = 2.0  # left out at the start of every chunk (its queue starts empty)
    search_warmup_s: float = 5.0  # one discarded run at start_rate before the first step
    confidence: float = 0.95  # of each decided verdict (per look)
    # shed + failed, of requests sent: the capacity's shed allowance. 1% by default; a workload whose request costs
    # span 10x (text) sheds a few % at every rate near capacity, and 1% there is decided by binomial noise on a
    # flat curve (docs/metrics.md "Capacity: the shed allowance"): benchmarks/serve_overload.py uses 5% on text
    max_error_fraction: float = 0.01
    max_steps: int = 20
    invalid_retries: int = 2  # rerun a chunk the generator invalidated (fell behind), at most this often
    # keep a chunk invalid only for late sends when at most this fraction was late (> 1 ms): on a shared machine
    # the 1% rule of a single load test rejects most chunks; 0.01 keeps that rule
    max_late_fraction: float = 0.01
    # ... or on at most this many sends whatever their fraction: at a few requests per second one send held up by
    # the OS (a page fault, another process's time slice) is already over 5% of a short chunk, and 1 of 12 late
    # sends once capped a search of a 62.5/s server at 4/s
    max_late_sends: int = 2
    early_stop: bool = True  # abort a chunk once the SLO is violated with confidence (early_stop.EarlyStop)
    # An early-stopped chunk fails its step alone only where the step is clearly above what passed: above
    # early_stop_decisive x the highest passing rate (or with nothing passed yet). Inside the bisection, one chunk's
    # burst is one observation: pooled, the step goes on, and a second early stop there fails it.
    early_stop_decisive: float = 1.25
    # idle seconds before each step after the first: the server's adaptive state (a learned admission margin, its
    # slack, its queue estimates) relaxes from the step before, so a step's verdict does not depend on the path
    # the bisection took to it (after a 2x-overloaded step, a learned margin at its ceiling sheds the next one)
    cooldown_s: float = 0.0
    # The refine phase (load/capacity_refine.py): 0 = off. Otherwise the bisection stops at ``refine_bracket``
    # (first failing / last passing - 1) and a grid in steps of ``precision`` from ``refine_below`` steps under the
    # passing rate to ``refine_above`` over the failing one is measured in this many interleaved rounds, one chunk
    # per rate a round, and judged on a monotone fit: the answer no longer rests on which steps met a fast minute
    refine_rounds: int = 0
    refine_bracket: float = 0.15
    refine_below: int = 2
    refine_above: int = 1

    def __post_init__(self) -> None:
        if not (self.start_rate > 0 and self.max_rate >= self.start_rate):
            raise ValueError("need 0 < start_rate <= max_rate")
        if not (0 < self.precision < 1 and 0 < self.confidence < 1 and 0 <= self.max_error_fraction < 1):
            raise ValueError("precision and confidence in (0, 1), max_error_fraction in [0, 1)")
        if not (self.chunk_s > 0 and 0 <= self.warmup_s < self.chunk_s and self.search_warmup_s >= 0):
            raise ValueError("need chunk_s > warmup_s >= 0 and search_warmup_s >= 0")
        if not MIN_BLOCKS <= self.min_chunks <= self.max_chunks:
            raise ValueError(f"need {MIN_BLOCKS} <= min_chunks <= max_chunks")
        if self.early_stop_decisive < 1 or self.cooldown_s < 0:
            raise ValueError("need early_stop_decisive >= 1 and cooldown_s >= 0")
        if self.refine_rounds < 0 or self.refine_below < 0 or self.refine_above < 0 or not 0 < self.refine_bracket < 1:
            raise ValueError("need refine_rounds, refine_below, refine_above >= 0 and 0 < refine_bracket < 1")
        if self.max_steps < 1 or self.invalid_retries < 0 or self.max_late_sends < 0:
            raise ValueError("max_chunks and max_steps >= 1, invalid_retries and max_late_sends >= 0")


def decide(n: int, k: int, block_n: Sequence[int], block_k: Sequence[int], p: float, alpha: float) -> str:
    """Is the true fraction of "over" requests <= ``p``? "pass", "fail" or "undecided".

    ``k`` of ``n`` requests were over; ``block_n``/``block_k`` the same per independent block (the search: per
    chunk). Decided only when the binomial tail over all requests (at level ``alpha``) and a one-sided
    batch-means t-test over the blocks' fractions (>= ``MIN_BLOCKS`` blocks) agree.
    """
    if n <= 0:
        return "undecided"
    from scipy.stats import binom
    from scipy.stats import t as student_t

    bin_fail = k > 0 and float(binom.sf(k - 1, n, p)) <= alpha
    bin_pass = float(binom.cdf(k, n, p)) <= alpha
    fr = [b_k / b_n for b_n, b_k in zip(block_n, block_k, strict=True) if b_n > 0]
    m = len(fr)
    if m < MIN_BLOCKS:
        return "undecided"
    mean = sum(fr) / m
    var = sum((f - mean) ** 2 for f in fr) / (m - 1)
    # every block alike: the sign decides (a zero spread is no doubt)
    tval = math.copysign(math.inf, mean - p) if var == 0.0 and mean != p else 0.0
    if var > 0.0:
        tval = (mean - p) / math.sqrt(var / m)
    crit = float(student_t.ppf(1.0 - alpha, m - 1))
    if bin_fail and tval > crit:
        return "fail"
    if bin_pass and tval < -crit:
        return "pass"
    return "undecided"


@dataclass
class _Pool:
    """A step's chunks, pooled (warm-up removed)."""

    threshold_ns: float
    lat: list[np.ndarray] = field(default_factory=list)  # corrected latency of ok requests
    block_sent: list[int] = field(default_factory=list)
    block_failed: list[int] = field(default_factory=list)
    block_ok: list[int] = field(default_factory=list)
    block_late: list[int] = field(default_factory=list)
    measured_s: float = 0.0
    chunks: int = 0
    invalid: int = 0
    late_kept: int = 0  # chunks kept though invalid for late sends alone (SearchConfig.max_late_fraction)
    flagged: bool = False  # "late" came from Segment.missed: judged as a fraction, not a latency quantile

    def add(self, seg: Segment, warmup_s: float, chunk_s: float) -> None:
        keep = seg.intended_ns >= int(warmup_s * 1e9)
        intended = seg.intended_ns[keep]
        lat = (seg.done_ns - seg.intended_ns)[keep]
        outcome = seg.outcome[keep]
        ok = outcome == 0
        self.lat.append(lat[ok])
        end_s = chunk_s if not seg.stopped_early else max(warmup_s, float(intended.max()) / 1e9 if intended.size else 0)
        self.measured_s += max(0.0, end_s - warmup_s)
        self.chunks += 1
        if seg.missed is not None:
            self.flagged = True
            late = ok & seg.missed[keep].astype(bool)
        else:
            late = ok & (lat > self.threshold_ns)
        # One chunk, one observation of the batch-means test: chunks are independent by construction (each its
        # own run, seed and empty queue), where 1-s blocks of one run are not (near capacity the misses come in
        # excursions of the queue that outlast a second: a chunk without one passes 1-s blocks "clearly").
        self.block_sent.append(int(outcome.size))
        self.block_failed.append(int((~ok).sum()))
        self.block_ok.append(int(ok.sum()))
        self.block_late.append(int(late.sum()))

    def latencies(self) -> np.ndarray:
        return np.sort(np.concatenate(self.lat)) if self.lat else np.array([], dtype=np.int64)


def _judge(pool: _Pool, slo: Slo, cfg: SearchConfig, final: bool) -> tuple[str, bool, str, dict[str, Any]]:
    """(verdict, passed, why, figures) of a pooled step; ``final``: no more chunks, an undecided step is judged
    on its point estimates."""
    alpha = 1.0 - cfg.confidence
    sent, failed = sum(pool.block_sent), sum(pool.block_failed)
    ok, late = sum(pool.block_ok), sum(pool.block_late)
    lat = pool.latencies()
    name = stats.format_q(slo.q)
    q_ms = float(lat[max(0, math.ceil(slo.q * lat.size) - 1)]) / 1e6 if lat.size else None
    ci = stats.order_stat_ci(lat.astype(float), slo.q, cfg.confidence) if lat.size else None
    fails_frac = failed / sent if sent else None
    figures = {
        "sent": sent,
        "ok": ok,
        "failed": failed,
        "late": late,
        "p50_ms": float(np.quantile(lat, 0.5)) / 1e6 if lat.size else None,
        "p99_ms": float(lat[max(0, math.ceil(0.99 * lat.size) - 1)]) / 1e6 if lat.size else None,
        "q_ms": q_ms,
        "q_ci_ms": None if ci is None else [ci[0] / 1e6, ci[1] / 1e6],
        "failed_fraction": fails_frac,
        "measured_s": pool.measured_s,
        "achieved_rate": sent / pool.measured_s if pool.measured_s else None,
        "throughput_ok": ok / pool.measured_s if pool.measured_s else None,
        "goodput": (ok - late) / pool.measured_s if pool.measured_s else None,
    }
    if sent == 0:  # not final: only an early-stopped chunk that ended in its warm-up (the step goes on)
        return ("fail" if final else "undecided"), False, "no request measured", figures
    if pool.chunks < cfg.min_chunks and not final:
        return "undecided", False, f"{pool.chunks} of at least {cfg.min_chunks} chunks", figures
    lat_v = decide(ok, late, pool.block_ok, pool.block_late, 1.0 - slo.q, alpha) if ok else "fail"
    err_v = decide(sent, failed, pool.block_sent, pool.block_failed, cfg.max_error_fraction, alpha)
    slo_txt = f"{slo.threshold_ns / 1e6:g} ms"
    q_txt = "-" if q_ms is None else f"{q_ms:.1f} ms"
    ci_txt = "" if ci is None else f" [{ci[0] / 1e6:.1f}, {ci[1] / 1e6:.1f}]"
    lat_txt = f"{name} {q_txt}{ci_txt}"
    lat_met = q_ms is not None and q_ms * 1e6 <= slo.threshold_ns
    if pool.flagged:  # judged on the fraction that missed: the quantile of the objectives, not of a latency
        lat_txt = f"{late} of {ok} missed ({late / ok if ok else 0:.1%})"
        slo_txt = f"{1 - slo.q:.1%} allowed"
        lat_met = ok > 0 and late <= (1 - slo.q) * ok
    f_txt = f"{fails_frac:.1%} shed or failed"
    if lat_v == "fail" or err_v == "fail":
        why = f"{lat_txt} > {slo_txt}" if lat_v == "fail" else f"{f_txt} > {cfg.max_error_fraction:.0%}"
        return "fail", False, why, figures
    if lat_v == "pass" and err_v == "pass":
        return "pass", True, f"{lat_txt} <= {slo_txt}, {f_txt}", figures
    if not final:
        return "undecided", False, f"{lat_txt} vs {slo_txt}, {f_txt}: undecided", figures
    passed = lat_met and failed <= cfg.max_error_fraction * sent
    why = (
        f"undecided after {pool.chunks} chunks, judged on the point estimates: {lat_txt} "
        f"{'<=' if lat_met else '>'} {slo_txt}, {f_txt}"
    )
    return "undecided", passed, why, figures


def chunk_seed(seed: int, rate: float, chunk: int) -> int:
    """Chunk ``chunk`` of the step at ``rate``: its own sample, the same for every server."""
    return step_seed(seed + 7919 * chunk, rate)


def measure_step(
    measure: MeasureFn,
    rate: float,
    slo: Slo,
    cfg: SearchConfig,
    seed: int,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
    early_stop_decides: bool = True,
) -> dict[str, Any]:
    """One step of ``search_capacity``: chunks at ``rate`` until the stopping rule decides (module docstring).

    ``early_stop_decides`` False (a step inside the bisection, ``SearchConfig.early_stop_decisive``): a chunk the
    abort rule stopped is pooled like any other (up to where it stopped) and the step goes on; a second one fails
    it."""
    pool = _Pool(slo.threshold_ns)
    verdict, passed, why = "undecided", False, ""
    figures: dict[str, Any] = {}
    chunk = 0
    early_stops = 0
    while pool.chunks < cfg.max_chunks:
        seg: Segment | None = None
        for _attempt in range(cfg.invalid_retries + 1):
            abort = EarlyStop(slo.q, cfg.confidence) if cfg.early_stop else None
            seg = measure(rate, cfg.chunk_s, chunk_seed(seed, rate, chunk), abort)
            chunk += 1
            if seg.usable(cfg.max_late_fraction, cfg.max_late_sends) or seg.stopped_early:
                break
            pool.invalid += 1
        assert seg is not None
        if not seg.valid and seg.usable(cfg.max_late_fraction, cfg.max_late_sends):
            pool.late_kept += 1
        if not seg.usable(cfg.max_late_fraction, cfg.max_late_sends) and not seg.stopped_early:
            # the generator's failure, not the server's: not passed, but no decided failure either
            verdict, passed, why = "invalid", False, f"invalid run {cfg.invalid_retries + 1} times: {seg.why_invalid}"
            break
        pool.add(seg, cfg.warmup_s, cfg.chunk_s)
        early_stops += bool(seg.stopped_early)
        if seg.stopped_early and (early_stop_decides or early_stops >= 2):
            _, _, _, figures = _judge(pool, slo, cfg, True)
            twice = "" if early_stop_decides else f" (early stop {early_stops} times)"
            verdict, passed, why = "fail", False, seg.stopped_early + twice
            break
        verdict, passed, why, figures = _judge(pool, slo, cfg, pool.chunks >= cfg.max_chunks)
        if on_chunk is not None:
            on_chunk({"offered_rate": rate, "chunks": pool.chunks, "verdict": verdict, "why": why, **figures})
        if verdict != "undecided":
            break
    return {
        "offered_rate": rate,
        **figures,
        "chunks": pool.chunks,
        "invalid_chunks": pool.invalid,
        "late_chunks_kept": pool.late_kept,
        "early_stops": early_stops,
        "verdict": verdict,
        "passed": passed,
        "why": why,
    }


def _bracket(steps: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(highest passing rate, lowest failing rate above it) of the steps so far. An invalid step (the generator
    fell behind) is no failure of the server: it is not the bracket's end (``_generator_ceiling``)."""
    passing = [s["offered_rate"] for s in steps if s["passed"]]
    lo = max(passing) if passing else None
    failing = [
        s["offered_rate"]
        for s in steps
        if not s["passed"] and s["verdict"] != "invalid" and (lo is None or s["offered_rate"] > lo)
    ]
    return lo, (min(failing) if failing else None)


def _generator_ceiling(steps: Sequence[dict[str, Any]], lo: float | None) -> dict[str, Any] | None:
    """The lowest invalid step above ``lo``: a rate the load generator could not keep, so nothing is known there."""
    bad = [s for s in steps if s["verdict"] == "invalid" and (lo is None or s["offered_rate"] > lo)]
    return min(bad, key=lambda s: s["offered_rate"]) if bad else None


def search_capacity(
    measure: MeasureFn,
    slo: Slo,
    cfg: SearchConfig | None = None,
    seed: int = 0,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Capacity:
    """The capacity at ``slo``: warm-up, then bracket and bisect with statistically judged steps (module docstring).
    ``sleep`` waits out ``cfg.cooldown_s`` between steps (a test passes a fake one)."""
    import scipy.stats  # noqa: F401 - imported now, not in the middle of the first timed step

    cfg = cfg or SearchConfig()
    if cfg.search_warmup_s > 0:
        measure(cfg.start_rate, cfg.search_warmup_s, step_seed(seed + 1, cfg.start_rate), None)  # discarded
    steps: list[dict[str, Any]] = []
    best_goodput: float | None = None
    rate = cfg.start_rate
    reason = f"stopped after {cfg.max_steps} steps"
    decided_fail = False  # the bracket's end: only a decided failure stops the doubling
    width = max(cfg.precision, cfg.refine_bracket) if cfg.refine_rounds else cfg.precision
    generator_bound = False
    for _ in range(cfg.max_steps):
        if steps and cfg.cooldown_s > 0:
            sleep(cfg.cooldown_s)
        lo, _ = _bracket(steps)
        decisive = lo is None or rate > cfg.early_stop_decisive * lo
        step = measure_step(measure, rate, slo, cfg, seed, on_chunk, decisive)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if step["passed"]:
            g = step.get("goodput")
            if g is not None and (best_goodput is None or g > best_goodput):
                best_goodput = g
        else:
            # an invalid step ends the doubling too: above a rate the generator cannot keep, none can be measured
            decided_fail = decided_fail or step["verdict"] in ("fail", "invalid")
        lo, hi = _bracket(steps)
        gen = _generator_ceiling(steps, lo)
        # the bracket's upper end: a decided failure, or a rate the generator could not keep, whichever is lower
        top = hi if gen is None or (hi is not None and hi <= gen["offered_rate"]) else gen["offered_rate"]
        if not decided_fail:
            # An undecided step judged a failure on its point estimates (a low rate, too few requests to certify
            # the quantile) does not end the doubling: one unlucky sample there would cap the whole search.
            if rate >= cfg.max_rate:
                reason = f"still passing (or undecided) at the maximum rate {cfg.max_rate:g}/s"
                break
            rate = min(rate * 2, cfg.max_rate)
            continue
        if lo is None:
            assert top is not None
            if top <= cfg.start_rate / 64:
                reason = "fails even at the lowest rate tried"
                if top != hi and gen is not None:
                    generator_bound = True
                    reason = f"the load generator fell behind even at {top:g}/s: nothing measured ({gen['why']})"
                break
            rate = top / 2
            continue
        if top is None:
            reason = f"passes at {lo:g}/s; no failure above it"
            break
        if top / lo - 1 <= width:
            if gen is not None and top == gen["offered_rate"] and top != hi:
                generator_bound = True
                reason = (
                    f"passes at {lo:g}/s; the load generator fell behind at {top:g}/s, so the server was not "
                    f"measured there: the capacity is at least {lo:g}/s (a lower bound; {gen['why']})"
                )
            else:
                reason = f"bracketed within {width:.0%}: passes at {lo:g}/s, fails at {top:g}/s"
                if cfg.refine_rounds:
                    return _refined(measure, slo, cfg, seed, steps, lo, top, reason, on_step, on_chunk, sleep)
            break
        rate = (lo + top) / 2
    lo, _ = _bracket(steps)
    return Capacity(slo.describe(), lo, best_goodput, tuple(steps), reason, generator_bound)


def _refined(
    measure: MeasureFn, slo: Slo, cfg: SearchConfig, seed: int, steps: list[dict[str, Any]], lo: float, top: float,
    bracket: str, on_step: Callable[[dict[str, Any]], None] | None,
    on_chunk: Callable[[dict[str, Any]], None] | None, sleep: Callable[[float], None],
) -> Capacity:  # fmt: skip
    """The refine phase after a bracket (load/capacity_refine.py): its rows join the steps (``phase`` "refine"),
    and its fit is the answer. Where even its lowest rate is over an allowance, the answer is the highest
    bisection pass below the refined rates (or none), and the reason says so."""
    from latencylab.load.capacity_refine import refine

    ref = refine(measure, slo, cfg, seed, lo, top, on_chunk, sleep)
    for row in ref.rows:  # ascending in rate, after the bisection's steps
        steps.append(row)
        if on_step is not None:
            on_step(row)
    cap, goodput, reason = ref.capacity_rate, ref.goodput, f"{bracket}; {ref.reason}"
    if cap is None:
        low = min(r["offered_rate"] for r in ref.rows)
        below = [s for s in steps if s.get("phase") != "refine" and s["passed"] and s["offered_rate"] < low]
        best = max(below, key=lambda s: s["offered_rate"]) if below else None
        cap = None if best is None else best["offered_rate"]
        goodput = None if best is None else best.get("goodput")
        reason += f"; the highest passing step below it: {cap:g}/s" if cap is not None else "; nothing passed below it"
    return Capacity(slo.describe(), cap, goodput, tuple(steps), reason)


@dataclass(frozen=True, slots=True)
class CapacitySpread:
    """K independent searches of one server: the answer is their median, quoted with its min-max."""

    slo: str
    searches: tuple[Capacity, ...]

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(c.capacity_rate for c in self.searches if c.capacity_rate is not None)

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    @property
    def generator_bound(self) -> bool:
        """Some search's answer is only a lower bound: the load generator fell behind above it."""
        return any(c.generator_bound for c in self.searches)

    @property
    def goodput(self) -> float | None:
        g = [c.goodput for c in self.searches if c.goodput is not None]
        return statistics.median(g) if g else None

    @property
    def spread(self) -> float | None:
        """Largest relative deviation of a search from the median (0.08 = +/-8%); None without two answers."""
        r, med = self.rates, self.median
        if len(r) < 2 or not med:
            return None
        return max(abs(x - med) for x in r) / med

    def describe(self) -> str:
        r = self.rates
        if not r:
            return f"no capacity found in {len(self.searches)} searches"
        bound = " (at least: the load generator fell behind above it)" if self.generator_bound else ""
        if len(self.searches) == 1:
            return f"{r[0]:.1f}/s{bound}"
        missing = len(self.searches) - len(r)
        extra = f"; {missing} searches found none" if missing else ""
        return (
            f"median {self.median:.1f}/s over {len(self.searches)} searches, min-max {min(r):.1f}-{max(r):.1f}/s, "
            f"spread +/-{(self.spread or 0.0):.1%}{extra}{bound}"
        )

    def result_doc(self, search: SearchConfig, env: Any, **summary: Any) -> dict[str, Any]:
        """The ``capacity`` result file (``--find-capacity --json``): the spread's summary (plus ``summary``'s
        extra fields), the first search's curve (what report draws), every search, and how it searched."""
        first = self.searches[0]
        return {
            "schema_version": 1,
            "kind": "capacity",
            "summary": {
                "slo": self.slo,
                **summary,
                "capacity_rate": self.median,
                "goodput": self.goodput,
                "min": min(self.rates, default=None),
                "max": max(self.rates, default=None),
                "spread": self.spread,
                "repeat": len(self.searches),
                "generator_bound": self.generator_bound,
            },
            "capacity": {**first.to_dict(), "capacity_rate": self.median, "goodput": self.goodput},
            "repeats": self.to_dict(),
            "search": {k: getattr(search, k) for k in search.__slots__},
            "env": env,
        }

    def to_dict(self) -> dict[str, Any]:
        r = self.rates
        return {
            "slo": self.slo,
            "capacity_rate": self.median,
            "goodput": self.goodput,
            "min": min(r) if r else None,
            "max": max(r) if r else None,
            "spread": self.spread,
            "rates": [c.capacity_rate for c in self.searches],
            "generator_bound": self.generator_bound,
            "searches": [c.to_dict() for c in self.searches],
        }


def repeat_capacity(
    measure: MeasureFn,
    slo: Slo,
    cfg: SearchConfig | None = None,
    repeat: int = 3,
    seed: int = 0,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_search: Callable[[int, Capacity], None] | None = None,
) -> CapacitySpread:
    """``repeat`` searches, each with its own seeds (search r uses ``seed + 104729 r``)."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    out = []
    for r in range(repeat):
        cap = search_capacity(measure, slo, cfg, seed + 104_729 * r, on_step)
        out.append(cap)
        if on_search is not None:
            on_search(r, cap)
    return CapacitySpread(slo.describe(), tuple(out))

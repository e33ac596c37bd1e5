"""When a running load test may stop early: a sequential SLO test that survives queueing.

Latencies of requests that share a queue are not independent. One burst of long
requests puts the next ten over the SLO together, and a binomial test that counts
them as ten independent misses, consulted every 50 ms from the tenth completion
on, fails a step on its first burst: every server then "fails" at the rate where
the arrival seed's first burst overflows its queue. Two corrections:

* **Few, fixed looks.** A timed run is judged at 25%, 50% and 75% of its planned
  duration, a counted one at 100, 200, 400, ... completions; the error rate
  ``1 - confidence`` is split among the looks (a third each for a timed run,
  ``alpha / 2**(k+1)`` for the k-th look of a counted one), so peeking does not
  inflate it.
* **Violated needs two independent witnesses.** The binomial tail over all
  completions (as before), *and* a batch-means t-test over 1-s blocks of
  intended send time (each block's miss fraction is one observation; blocks are
  far less correlated than requests). A single burst fills one block and fails
  neither the t-test nor, over the whole step, the SLO; a queue that keeps
  growing fills every block and fails both.

"Met" (``decide_met``) stays the binomial lower tail: a run with no misses has
no clustering to correct for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from latencylab import stats

TIMED_LOOKS = (0.25, 0.5, 0.75)
MIN_BLOCKS = 3


@dataclass(frozen=True, slots=True)
class Progress:
    """What the generator knows at a look (see ``generator.AbortFn``)."""

    completed: int
    over: int  # completed requests that missed the SLO or did not succeed
    elapsed_s: float  # since the first intended send
    planned_s: float | None  # the run's planned duration, None for a counted run
    block_n: Sequence[int] = ()  # completions per 1-s block of intended send time
    block_over: Sequence[int] = ()  # misses per block


def block_t_violated(block_n: Sequence[int], block_over: Sequence[int], p: float, alpha: float) -> bool:
    """Batch-means test: the mean per-block miss fraction exceeds ``p`` at level ``alpha`` (one-sided t)."""
    from scipy.stats import t as student_t

    fr = [o / n for n, o in zip(block_n, block_over, strict=True) if n > 0]
    m = len(fr)
    if m < MIN_BLOCKS:
        return False
    mean = sum(fr) / m
    if mean <= p:
        return False
    var = sum((f - mean) ** 2 for f in fr) / (m - 1)
    if var == 0.0:
        return True  # every block equally over p
    tval = (mean - p) / math.sqrt(var / m)
    return bool(tval > student_t.ppf(1.0 - alpha, m - 1))


class EarlyStop:
    """Stateful abort rule for one run: call it with ``Progress``; returns a reason, or "" to go on."""

    def __init__(self, q: float, confidence: float = 0.99, decide_met: bool = False, min_requests: int = 1) -> None:
        if not 0 < confidence < 1:
            raise ValueError("confidence must be in (0, 1)")
        self.q = q
        self.confidence = confidence
        self.decide_met = decide_met
        self.min_requests = max(1, min_requests)
        self._looks_done = 0

    def _due(self, pr: Progress) -> float | None:
        """The alpha for a look due now, or None."""
        alpha = 1.0 - self.confidence
        k = self._looks_done
        if pr.planned_s is not None:
            if k >= len(TIMED_LOOKS) or pr.elapsed_s < TIMED_LOOKS[k] * pr.planned_s:
                return None
            while k + 1 < len(TIMED_LOOKS) and pr.elapsed_s >= TIMED_LOOKS[k + 1] * pr.planned_s:
                k += 1  # a late tick skips looks it already passed; their alpha is simply not spent
            self._looks_done = k + 1
            return alpha / len(TIMED_LOOKS)
        if pr.completed < 100 * 2**k:
            return None
        self._looks_done = k + 1
        return alpha / 2 ** (k + 1)

    def __call__(self, pr: Progress) -> str:
        if pr.completed < self.min_requests:
            return ""
        alpha = self._due(pr)
        if alpha is None:
            return ""
        conf = 1.0 - alpha
        p = 1.0 - self.q
        if stats.slo_violated(pr.completed, pr.over, self.q, conf) and block_t_violated(
            pr.block_n, pr.block_over, p, alpha
        ):
            return (
                f"SLO violated with {self.confidence:.0%} confidence after {pr.completed} requests "
                f"({pr.over} over, {pr.elapsed_s:.1f} s)"
            )
        if self.decide_met and stats.slo_met(pr.completed, pr.over, self.q, conf):
            return f"SLO met with {self.confidence:.0%} confidence after {pr.completed} requests"
        return ""

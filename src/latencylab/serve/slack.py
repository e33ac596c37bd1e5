"""Admission slack: a high quantile of how much later than predicted admitted requests finish.

Admission refuses a request whose predicted finish is past its deadline, but the prediction is built from
means (EWMAs of batch and preprocess times, a fixed 3-ms margin), while the objective is a quantile. Where
the compute thread, the preprocess threads and the event loop share a core and the GIL, actual finishes
scatter around the prediction, so a request admitted with a prediction just inside its deadline finishes
late about half the time. ``PredictionError`` keeps the errors (actual - predicted finish, ns) of the
requests admitted in the last ``window_s`` and their ``q`` quantile; admission adds the part beyond the
fixed margin. If the error does not depend on the prediction, an admitted request then finishes by its
deadline with probability ~q.

Bounded memory in time: errors older than ``window_s`` are forgotten, so a stall cannot hold the slack up
after it (the trap of estimates that only admitted requests can correct). With fewer than
``min_samples`` errors in the window (too few for the quantile itself) but at least ``every``, the
largest error stands in for it: the best estimate a small sample has, instead of none. The first
seconds of a burst, when the window is filling, are when admission most needs it. With fewer than
``every`` errors the slack is 0: admission behaves as without it.
"""

from __future__ import annotations

import numpy as np


class PredictionError:
    def __init__(
        self, q: float, window_s: float = 2.0, size: int = 1024, min_samples: int = 100, every: int = 16
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be a fraction, e.g. 0.99")
        self.q = q
        self.window_ns = int(window_s * 1e9)
        self.min_samples = min_samples
        self.every = every
        self._t = np.zeros(size, dtype=np.int64)
        self._err = np.zeros(size, dtype=np.int64)
        self._n = 0
        self._computed_at = 0
        self.quantile_ns = 0

    def observe(self, now_ns: int, error_ns: int) -> None:
        """One admitted request finished (or failed) at ``now_ns``, ``error_ns`` after its predicted finish."""
        i = self._n % self._t.size
        self._t[i] = now_ns
        self._err[i] = error_ns
        self._n += 1
        if self._n % self.every == 0:
            self._recompute(now_ns)

    def _recompute(self, now_ns: int) -> None:
        k = min(self._n, self._t.size)
        recent = self._err[:k][self._t[:k] >= now_ns - self.window_ns]
        if recent.size >= self.min_samples:
            self.quantile_ns = int(np.quantile(recent, self.q))
        else:  # a small sample's best estimate of a high quantile is its largest value
            self.quantile_ns = int(recent.max()) if recent.size >= self.every else 0
        self._computed_at = now_ns

    def slack_ns(self, now_ns: int, margin_ns: int) -> int:
        """Time to add to a prediction that already carries ``margin_ns``: the error quantile beyond it (>= 0)."""
        if self.quantile_ns and now_ns - self._computed_at > self.window_ns // 4:  # no recent finishes: age out
            self._recompute(now_ns)
        return max(0, self.quantile_ns - margin_ns)

"""Admission slack: what admission adds to its predicted finish so that the tail, not the mean, fits.

Admission predicts a finish from means (EWMAs of batch and preprocess times, a fixed 3-ms margin), while
the objective is a quantile. Where the compute thread, the preprocess threads and the event loop share a
core and the GIL, actual finishes scatter around the prediction, so under overload, when every admitted
request is admitted just inside its deadline, about half of them finish late.

Three ways to size the slack were measured (vision, one core, SLO p99 30 ms; docs/BENCHMARKS.md):

* the ``q`` quantile of the prediction errors of *all* recent requests: p99 met at 2x capacity, but 28-32%
  shed at the load the server met the SLO at with no shedding (p99 21-23 ms against 30): large errors come
  in bursts when the prediction lags the load, and this charges them to every request;
* a controller on the realised tail (finish - deadline): sheds nothing at capacity, but at 2x capacity it
  lags its own window and oscillates between shedding almost everything and too little (p99 39 ms, goodput
  68% of capacity);
* ``BoundarySlack``, kept: the ``q`` quantile of the errors of requests admitted *near the boundary*, the
  only ones whose errors decide the tail under overload. At 390 req/s (2x): p99 29.6 ms with 316 req/s
  served; at 190 req/s: 0.7% refused, p99 28.0 ms.
"""

from __future__ import annotations

import numpy as np


class BoundarySlack:
    """Admission slack from the prediction errors of requests admitted near their deadline.

    Under overload every admitted request is admitted at the boundary (predicted finish + margin + slack just
    inside its deadline), so the tail of the finishes is the tail of the prediction error there: the slack it
    needs is that error's ``q`` quantile beyond the margin. At lighter loads requests are admitted with room to
    spare, and their errors (large ones come in bursts, when the prediction lags the load) say nothing about
    the boundary: only requests admitted with less than ``band_ns`` of headroom beyond margin + slack are kept.
    With fewer than ``min_samples`` of them in the last ``window_s`` the slack halves every ``interval_s``, so
    at loads the server meets its objective it sits at 0 and admission sheds nothing it would not anyway.
    """

    def __init__(
        self,
        q: float,
        band_ns: int = 5_000_000,
        window_s: float = 2.0,
        interval_s: float = 0.1,
        min_samples: int = 50,
        size: int = 2048,
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be a fraction, e.g. 0.99")
        self.q = q
        self.band_ns = band_ns
        self.window_ns = int(window_s * 1e9)
        self.interval_ns = int(interval_s * 1e9)
        self.min_samples = min_samples
        self._t = np.zeros(size, dtype=np.int64)
        self._err = np.zeros(size, dtype=np.int64)
        self._n = 0
        self._updated_at: int | None = None
        self.slack_ns = 0

    def near(self, headroom_ns: int, margin_ns: int) -> bool:
        """Whether a request admitted with this headroom (deadline - predicted finish) was near the boundary."""
        return headroom_ns <= margin_ns + self.slack_ns + self.band_ns

    def observe(self, now_ns: int, error_ns: int) -> None:
        """A near-boundary request finished ``error_ns`` after its predicted finish."""
        i = self._n % self._t.size
        self._t[i] = now_ns
        self._err[i] = error_ns
        self._n += 1

    def current(self, now_ns: int, margin_ns: int) -> int:
        if self._updated_at is None:
            self._updated_at = now_ns
        elif now_ns - self._updated_at >= self.interval_ns:
            self._updated_at = now_ns
            k = min(self._n, self._t.size)
            recent = self._err[:k][self._t[:k] >= now_ns - self.window_ns]
            if recent.size >= self.min_samples:
                self.slack_ns = max(0, int(np.quantile(recent, self.q)) - margin_ns)
            else:
                self.slack_ns //= 2
        return self.slack_ns

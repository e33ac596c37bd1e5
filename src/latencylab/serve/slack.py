"""Admission slack by feedback: tighten admission only as far as the realised tail needs.

Admission predicts a finish from means (EWMAs of batch and preprocess times, a fixed 3-ms margin), while
the objective is a quantile. Where the compute thread, the preprocess threads and the event loop share a
core and the GIL, actual finishes scatter around the prediction, so under overload a request admitted with
a prediction just inside its deadline finishes late about half the time.

Two model-based corrections were measured and dropped (docs/BENCHMARKS.md, "Overload"):

* adding the ``q`` quantile of recent prediction errors to every prediction makes *each* request as safe as
  the objective asks of all of them together: p99 at 2x capacity met, but 28-32% shed at the load the
  server met the SLO at with no shedding (p99 21-23 ms against 30);
* admitting by expected misses (each admission earning the target miss rate and spending its own miss
  probability, estimated from those errors) still shed 1.5-3% there: the large errors come in bursts, when
  the prediction lags the load, and the estimate spreads them over every request.

``SlackController`` closes the loop on the objective itself. Every answered (or failed) request reports
how far before or after its deadline it finished; every ``interval_s`` the controller takes the ``q``
quantile of those reports over the last ``window_s`` and moves the slack, which admission adds to every
prediction, by ``gain`` x (quantile - target): up when the tail runs later than ``target`` (by default the
answer leaves ``outside_ns`` before the deadline, for the time outside the server's clock), down when it
runs earlier, never below 0. At loads the server meets its objective the slack sits at 0 and admission
sheds nothing it would not have shed anyway; under overload it rises until the tail fits. With fewer than
``min_samples`` reports in the window (nothing admitted for a while) it halves at every update, so it
cannot keep admission shut once the evidence is gone.
"""

from __future__ import annotations

import numpy as np


class SlackController:
    def __init__(
        self,
        q: float,
        outside_ns: int = 1_500_000,
        window_s: float = 2.0,
        interval_s: float = 0.1,
        gain: float = 0.2,
        min_samples: int = 50,
        size: int = 2048,
        max_slack_ns: int = 1_000_000_000,
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be a fraction, e.g. 0.99")
        if not 0 < gain <= 1:
            raise ValueError("gain must be in (0, 1]")
        self.q = q
        self.target_ns = -int(outside_ns)  # finish - deadline the tail should stay under
        self.window_ns = int(window_s * 1e9)
        self.interval_ns = int(interval_s * 1e9)
        self.gain = gain
        self.min_samples = min_samples
        self.max_slack_ns = max_slack_ns
        self._t = np.zeros(size, dtype=np.int64)
        self._x = np.zeros(size, dtype=np.int64)
        self._n = 0
        self._updated_at: int | None = None
        self.slack_ns = 0
        self.tail_ns: int | None = None  # the last window quantile of finish - deadline

    def observe(self, now_ns: int, late_ns: int) -> None:
        """A request finished at ``now_ns``, ``late_ns`` after its deadline (negative: before it)."""
        i = self._n % self._t.size
        self._t[i] = now_ns
        self._x[i] = late_ns
        self._n += 1

    def current(self, now_ns: int) -> int:
        """The slack (ns) admission adds to its prediction now (updated at most every ``interval_s``)."""
        if self._updated_at is None:
            self._updated_at = now_ns
        elif now_ns - self._updated_at >= self.interval_ns:
            self._update(now_ns)
        return self.slack_ns

    def _update(self, now_ns: int) -> None:
        self._updated_at = now_ns
        k = min(self._n, self._t.size)
        recent = self._x[:k][self._t[:k] >= now_ns - self.window_ns]
        if recent.size < self.min_samples:
            self.tail_ns = None
            self.slack_ns //= 2
            return
        self.tail_ns = int(np.quantile(recent, self.q))
        step = self.gain * (self.tail_ns - self.target_ns)
        self.slack_ns = int(min(self.max_slack_ns, max(0.0, self.slack_ns + step)))

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


class LearnedMargin:
    """Admission's planning margin, learned from the latency of the requests it admitted (a feedback loop).

    Admission plans each finish by ``deadline - margin`` (scaled by min(budget, SLO) / SLO for other budgets).
    A fixed margin of (1 - f) x SLO left the admitted p99 over the SLO in some 10-s windows at 2x overload
    (docs/benchmarks/serve.md, session 9): what admission cannot predict varies with the load and the machine.
    Here the margin is the output of a controller on what was actually served. Every admitted request that ends
    (answered, or a 504 counting at least its whole budget) leaves its *excess*: its latency from its start less
    its target (f x SLO for a budget of one SLO). Every ``interval_ns`` the ``q`` quantile of the excesses of the
    last ``window_ns`` (at least ``min_samples`` of them, else the margin decays by half a step) moves the margin:

        margin += gain x quantile,  the move clipped to +/- one step (SLO / 30)

    so a tail over the target raises it and a tail under it gives goodput back, both in proportion to the
    distance, at most one step per interval (a stall's outliers cannot throw it to its ceiling in one go). Its
    fixed point is where the windowed ``q`` quantile of the admitted latency is the target. It stays in
    [0, ``max_fraction`` x SLO].

    Why a windowed quantile rather than per-request quantile tracking: measured at 2x overload on vision (SLO
    30 ms, session 10, docs/benchmarks/serve.md), a Robbins-Monro tracker of the 99.5% quantile with a ceiling of
    0.5 x SLO climbed to 13.7 ms without moving the tail (worst 10-s window 29.8 ms, against 30.9-32.1 ms with the
    fixed 3 ms) and relaxed at 1/199 of a step per request, so it still refused 60% at the capacity rate after a
    burst: goodput 65% of capacity at 2x. There the tail comes from work admission does not control (every
    refused request is read and decoded before admission, on the same core as the compute).

    Why the ceiling is 0.5 x SLO (it was 0.2 until session 16): on the text model (SLO 300 ms, 2x and 4x
    overload) this controller sat at the 0.2 ceiling (60 ms) in every run while the admitted p99 stayed at
    302-310 ms and 6-13% of the admitted ended 504: its predictions miss by more than 60 ms there (later short
    requests overtake a long one; batches of long passages overrun). With 0.5 it settled at 97-150 ms: p99 of
    admitted 286-303 ms, 504s 1.0-2.2%, goodput unchanged or higher (docs/benchmarks/serve.md, "Session 16").
    On vision the margin stays near 0 whichever the ceiling: it does not bind there.
    """

    def __init__(
        self,
        slo_ns: int,
        target_fraction: float,
        q: float = 0.99,
        step_fraction: float = 1 / 30,
        max_fraction: float = 0.5,
        interval_ns: int = 200_000_000,
        window_ns: int = 2_000_000_000,
        gain: float = 0.1,
        min_samples: int = 50,
        size: int = 4096,
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be a fraction, e.g. 0.99")
        if not 0 < target_fraction <= 1:
            raise ValueError("target_fraction must be in (0, 1]")
        self.slo_ns = slo_ns
        self.target_fraction = target_fraction
        self.q = q
        self.step_ns = max(1.0, step_fraction * slo_ns)
        self.max_ns = max_fraction * slo_ns
        self.interval_ns = interval_ns
        self.window_ns = window_ns
        self.gain = gain
        self.min_samples = min_samples
        self._t = np.zeros(size, dtype=np.int64)
        self._excess = np.zeros(size, dtype=np.int64)
        self._n = 0
        self._margin = (1.0 - target_fraction) * slo_ns  # starts where the fixed margin was
        self._updated_at: int | None = None
        self.over = 0  # outcomes over the target, since the start
        self.seen = 0  # outcomes observed, since the start

    @property
    def margin_ns(self) -> int:
        """The margin for a request whose budget is at least the SLO."""
        return int(self._margin)

    def scaled_ns(self, budget_ns: int) -> int:
        """The margin for a request with ``budget_ns`` (deadline - start): scaled by min(budget, SLO) / SLO."""
        return int(self._margin * min(budget_ns, self.slo_ns) / self.slo_ns)

    def target_ns(self, budget_ns: int) -> int:
        """The latency an admitted request with ``budget_ns`` is aimed inside: its budget less (1 - f) x
        min(budget, SLO) (f x SLO when the budget is the SLO)."""
        return budget_ns - int((1.0 - self.target_fraction) * min(budget_ns, self.slo_ns))

    def observe(self, now_ns: int, latency_ns: int, budget_ns: int) -> None:
        """An admitted request ended ``latency_ns`` after its start (answered, or a 504 at its deadline)."""
        excess = latency_ns - self.target_ns(budget_ns)
        self.seen += 1
        self.over += excess > 0
        i = self._n % self._t.size
        self._t[i] = now_ns
        self._excess[i] = excess
        self._n += 1
        self.update(now_ns)

    def update(self, now_ns: int) -> int:
        """Move the margin if ``interval_ns`` has passed since the last move (admission calls this too, so the
        margin decays while nothing ends); the margin now."""
        if self._updated_at is None:
            self._updated_at = now_ns
            return self.margin_ns
        if now_ns - self._updated_at < self.interval_ns:
            return self.margin_ns
        self._updated_at = now_ns
        k = min(self._n, self._t.size)
        recent = self._excess[:k][self._t[:k] >= now_ns - self.window_ns]
        if recent.size >= self.min_samples:
            move = self.gain * float(np.quantile(recent, self.q))
            move = max(-self.step_ns, min(self.step_ns, move))
        else:  # too little evidence (a light load): give the margin back, half a step per interval
            move = -self.step_ns / 2
        self._margin = max(0.0, min(self.max_ns, self._margin + move))
        return self.margin_ns

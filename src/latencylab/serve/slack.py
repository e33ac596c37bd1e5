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
    """Admission's planning margin, learned from the latency of the requests it admitted (a quantile tracker).

    Admission plans each finish by ``deadline - margin`` (scaled by min(budget, SLO) / SLO for other budgets).
    A fixed margin of (1 - f) x SLO left the admitted p99 over the SLO in some 10-s windows at 2x overload
    (docs/benchmarks/serve.md, session 9): what admission cannot predict varies with the load and the machine.
    Here the margin is the output of a feedback loop on what was actually served: every admitted request's
    outcome (its latency from its start, a 504 counting at least its whole budget) is compared with the
    objective ``target`` (f x SLO for a budget of one SLO) and moves the margin by the stochastic-approximation
    rule of quantile tracking (Robbins-Monro):

        latency > target:  margin += step            (the tail is too long: plan earlier finishes)
        otherwise:         margin -= step x (1 - q) / q    (room to spare: give goodput back)

    Its fixed point is where a fraction ``1 - q`` of the admitted requests exceed the target, i.e. where the
    ``q`` quantile of the admitted latency sits at ``target``. With ``q`` above the SLO's own quantile (0.995
    against a p99 objective) the p99 sits a little under the target, and the SLO (target / f) keeps the rest of
    the headroom for window-to-window noise. The loop's delay is one request's latency (the margin acts on the
    next admissions), not a window's, so it does not oscillate as a controller on a windowed p99 does.

    A stall makes every request in flight late at once; one stall must not throw the margin to its ceiling (it
    would then relax at the slow rate for tens of seconds while shedding goodput), so the margin grows by at
    most ``max_up_steps`` steps per ``interval_ns``. It stays within [0, ``max_fraction`` x SLO].

    Why the ceiling is low (0.2 x SLO, twice the fixed margin at f = 0.9): measured at 2x overload on vision (SLO
    30 ms, session 10, docs/benchmarks/serve.md), a ceiling of 0.5 x SLO let the margin climb to 13.7 ms without
    moving the tail (worst 10-s window 29.8 ms, against 30.9-32.1 ms with the fixed 3 ms) while halving the
    goodput: there the tail comes from work admission does not control (every refused request is read and
    decoded before admission, on the same core as the compute), and a margin cannot refuse it away.
    """

    def __init__(
        self,
        slo_ns: int,
        target_fraction: float,
        q: float = 0.995,
        step_fraction: float = 1 / 30,
        max_fraction: float = 0.2,
        interval_ns: int = 100_000_000,
        max_up_steps: int = 5,
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be a fraction, e.g. 0.995")
        if not 0 < target_fraction <= 1:
            raise ValueError("target_fraction must be in (0, 1]")
        self.slo_ns = slo_ns
        self.target_fraction = target_fraction
        self.q = q
        self.step_ns = max(1.0, step_fraction * slo_ns)
        self.down_ns = self.step_ns * (1.0 - q) / q
        self.max_ns = max_fraction * slo_ns
        self.interval_ns = interval_ns
        self.max_up_ns = max_up_steps * self.step_ns
        self._margin = (1.0 - target_fraction) * slo_ns  # starts where the fixed margin was
        self._interval_start: int | None = None
        self._up_in_interval = 0.0
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
        self.seen += 1
        if latency_ns > self.target_ns(budget_ns):
            self.over += 1
            if self._interval_start is None or now_ns - self._interval_start >= self.interval_ns:
                self._interval_start, self._up_in_interval = now_ns, 0.0
            up = min(self.step_ns, self.max_up_ns - self._up_in_interval)
            if up > 0:
                self._up_in_interval += up
                self._margin = min(self.max_ns, self._margin + up)
        else:
            self._margin = max(0.0, self._margin - self.down_ns)

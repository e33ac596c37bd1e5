"""Admission for the deadline-aware batcher: will a request make its deadline, and what does a batch cost?

A :class:`LatencyModel` per cost bucket predicts a batch's compute time (forward + postprocess) from its
size, learned online from every batch run and seeded by warm-up. From those predictions and what is queued,
running and reserved, :class:`Admission` answers when a request admitted now would be answered; requests
whose predicted finish is past their deadline are refused (``Shed("deadline")``, a 503) before they queue,
instead of timing out in it, and a full queue refuses with ``Shed("queue_full")``. Admitted requests still
preprocessing count as queued ahead of later ones (a reservation). Once preprocessed, a bucketed request is
admitted again in its own bucket's order (``recheck``).

:class:`Admission` is the admission half of :class:`latencylab.serve.batcher.Batcher`, which holds the
queues, the running batches and the loop that releases them (serve/batcher.py): the state below is the
batcher's, set up in its ``__init__``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latencylab.serve.batcher import Job

__all__ = ["Admission", "LatencyModel", "Shed", "retry_after_header"]


class Shed(Exception):
    """The request is refused before queueing (503 + Retry-After)."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class LatencyModel:
    """Predicted batch compute time (forward + postprocess) per batch size: an EWMA per size.

    Sizes never seen are interpolated linearly between the nearest seen sizes
    (and extrapolated from the largest with its per-item cost).
    """

    def __init__(self, alpha: float = 0.2, clip: float = 4.0) -> None:
        self.alpha = alpha
        self.clip = clip
        self.by_size: dict[int, float] = {}

    def observe(self, size: int, seconds: float) -> None:
        """Fold one measured batch time in. A single stall is clipped to ``clip`` x the estimate first, so one
        190-ms hiccup cannot make every later admission look infeasible (a real slowdown still raises the
        estimate by up to ``alpha * (clip - 1)`` per batch and is learned within a few batches)."""
        old = self.by_size.get(size)
        if old is not None:
            seconds = min(seconds, self.clip * old)
        self.by_size[size] = seconds if old is None else old + self.alpha * (seconds - old)

    def remeasure(self, size: int, seconds: float) -> None:
        """A probe's measured time replaces the estimate instead of nudging it: a probe runs only where the
        estimate refused everything (so nothing else could correct it). When it came in under the prediction,
        every size is scaled down by the same ratio: the whole curve was an over-estimate."""
        predicted = self.predict(size)
        if predicted > 0 and 0 < seconds < predicted:
            ratio = seconds / predicted
            self.by_size = {s: t * ratio for s, t in self.by_size.items()}
        self.by_size[size] = seconds

    def predict(self, size: int) -> float:
        if not self.by_size:
            return 0.0
        if size in self.by_size:
            return self.by_size[size]
        sizes = sorted(self.by_size)
        lower = [s for s in sizes if s < size]
        upper = [s for s in sizes if s > size]
        if lower and upper:
            a, b = lower[-1], upper[0]
            ta, tb = self.by_size[a], self.by_size[b]
            return ta + (tb - ta) * (size - a) / (b - a)
        if upper:
            return self.by_size[upper[0]]
        top = sizes[-1]
        return self.by_size[top] * size / top


class Admission:
    """Admission control and the cost model behind it: the predictions of a :class:`Batcher`."""

    # The batcher's state (set up in Batcher.__init__), read and updated here.
    workers: int
    max_batch: int
    max_queue: int
    model: LatencyModel
    margin_ns: int
    probe_after_ns: int
    _bucket_of: Callable[[Any], int] | None
    _queues: dict[int, list[Job]]
    _models: dict[int, LatencyModel]
    _queued: int
    _reserved: int
    _running: dict[int, tuple[int, float]]
    _last_admit_ns: int | None
    _started_ns: int | None
    _ran_ns: dict[int, int]

    def _model(self, bucket: int) -> LatencyModel:
        m = self._models.get(bucket)
        if m is None:
            m = self._models[bucket] = LatencyModel()
        return m

    def predict(self, bucket: int, size: int) -> float:
        """Predicted compute (s) of a batch of ``size`` items of ``bucket``.

        A bucket never measured borrows the nearest measured one, scaled by the ratio of the buckets (they are
        padded lengths: compute grows about linearly with tokens at these widths)."""
        m = self._models.get(bucket)
        if m is not None and m.by_size:
            return m.predict(size)
        known = [b for b, mb in self._models.items() if mb.by_size]
        if not known:
            return 0.0
        near = min(known, key=lambda b: (abs(b - bucket), b))
        scale = bucket / near if bucket > 0 and near > 0 else 1.0
        return self._models[near].predict(size) * scale

    def predicted_finish_ns(self, now: int) -> int:
        """When a request admitted now would be answered, if batches run back to back."""
        if self._bucket_of is not None:
            return self._predicted_finish_bucketed(now)
        n_ahead = len(self._queues[0]) + self._reserved
        remaining = []
        for start, predicted in self._running.values():
            elapsed = (now - start) / 1e9
            # a batch running past its prediction is assumed to need as long again (a stall signal)
            remaining.append(predicted - elapsed if elapsed < predicted else elapsed)
        full_batches = n_ahead // self.max_batch
        own = n_ahead % self.max_batch + 1
        if self.workers == 1:
            wait = sum(remaining)
        else:  # work ahead shared by the workers; a worker is free when the soonest running batch ends
            idle = self.workers - len(remaining)
            first_free = 0.0 if idle > 0 else min(remaining)
            wait = max(first_free, (sum(remaining) + full_batches * self.model.predict(self.max_batch)) / self.workers)
            full_batches = 0
        seconds = wait + full_batches * self.model.predict(self.max_batch) + self.model.predict(own)
        return now + int(seconds * 1e9)

    def own_cost_s(self) -> float:
        """The predicted compute (s) of a request on an idle server: the floor of ``predicted_finish_ns - now``,
        which no number of replicas lowers (the autoscaling pressure's floor, scaleout/autoscale.py)."""
        if self._bucket_of is not None:
            return self.predict(self._cheapest_bucket(), 1)
        return self.model.predict(1)

    def _remaining(self, now: int) -> list[float]:
        out = []
        for start, predicted in self._running.values():
            elapsed = (now - start) / 1e9
            out.append(predicted - elapsed if elapsed < predicted else elapsed)
        return out

    def _predicted_finish_bucketed(self, now: int) -> int:
        """Admission happens before preprocessing, so the request's bucket is not known yet: it is predicted to
        wait for all the work queued (every bucket, in full batches) and to cost a batch of one of the
        cheapest bucket; reservations count as such batches too."""
        remaining = self._remaining(now)
        queued = 0.0
        for b, q in self._queues.items():
            full, rest = divmod(len(q), self.max_batch)
            queued += full * self.predict(b, self.max_batch) + (self.predict(b, rest) if rest else 0.0)
        own = self.predict(self._cheapest_bucket(), 1)
        queued += self._reserved * own
        idle = self.workers - len(remaining)
        first_free = 0.0 if idle > 0 else min(remaining)
        wait = max(first_free, (sum(remaining) + queued) / self.workers)
        return now + int((wait + own) * 1e9)

    def predicted_finish_in_bucket(self, bucket: int, deadline_ns: int, now: int, aim_ns: int | None = None) -> int:
        """When a request of ``bucket`` (known once preprocessed) with ``deadline_ns``, queued now, would be
        answered if batches run back to back in the batcher's order: after the running batches, every queued
        batch of a bucket no more costly than its own (shortest first, see ``_pick``), the requests of its own
        bucket due no later than it (EDF: the batch it joins, and the full batches before it), the requests of
        costlier buckets aimed at a finish no later than its own ``aim_ns`` (default: the deadline; they are let
        ahead of it when their aim is at risk, ``Batcher._pick``), and the other admitted requests still
        preprocessing (as batches of one of the cheapest bucket, as at admission); then its own batch. The rest
        of the costlier buckets goes after it."""
        aim = deadline_ns if aim_ns is None else aim_ns
        remaining = self._remaining(now)
        own_cost = self.predict(bucket, 1)
        queued = 0.0
        ahead = 0
        for b, q in self._queues.items():
            if b == bucket:
                ahead = sum(1 for j in q if j.deadline_ns <= deadline_ns)
            elif q and self.predict(b, 1) <= own_cost:
                full, rest = divmod(len(q), self.max_batch)
                queued += full * self.predict(b, self.max_batch) + (self.predict(b, rest) if rest else 0.0)
            elif q:  # costlier: only what is aimed sooner goes first
                sooner = sum(1 for j in q if j.aim_ns <= aim)
                full, rest = divmod(sooner, self.max_batch)
                queued += full * self.predict(b, self.max_batch) + (self.predict(b, rest) if rest else 0.0)
        full, rest = divmod(ahead, self.max_batch)
        queued += full * self.predict(bucket, self.max_batch)
        others = max(0, self._reserved - 1)  # the caller's own reservation is still held
        queued += others * self.predict(self._cheapest_bucket(), 1)
        idle = self.workers - len(remaining)
        first_free = 0.0 if idle > 0 else min(remaining)
        wait = max(first_free, (sum(remaining) + queued) / self.workers)
        return now + int((wait + self.predict(bucket, rest + 1)) * 1e9)

    def recheck(self, item: Any, deadline_ns: int, now: int, extra_ns: int = 0, admit_by_ns: int | None = None) -> None:
        """Admission again, now that the item's cost bucket is known (a bucketed variant; else nothing).

        Raises Shed("deadline") if, in its bucket's order (EDF by ``deadline_ns``), it is predicted to finish
        (+ margin + ``extra_ns``) after ``admit_by_ns`` (default: the deadline). Admission before preprocessing
        can only assume the cheapest bucket, so without this a burst of long texts is admitted and then fails at
        release with 504. A bucket that has not run for ``probe_after_ns`` is let through (its estimate may be
        stale: the release probes it)."""
        if self._bucket_of is None:
            return
        bucket = int(self._bucket_of(item))
        limit = deadline_ns if admit_by_ns is None else admit_by_ns
        finish = self.predicted_finish_in_bucket(bucket, deadline_ns, now, limit) + self.margin_ns + extra_ns
        if finish > limit and not self.bucket_stale(bucket, now):
            raise Shed("deadline", max(0.1, (finish - now) / 1e9))

    def bucket_stale(self, bucket: int, now: int) -> bool:
        """No batch of ``bucket`` released for ``probe_after_ns`` since the batcher started: its estimate is one
        nothing has refuted lately, so the next batch runs even if predicted late (before ``start``: never)."""
        since = self._ran_ns.get(bucket, self._started_ns)
        return since is not None and now - since > self.probe_after_ns

    def admit(self, deadline_ns: int, now: int, lead_ns: int = 0) -> None:
        """Reserve a place, or raise Shed if the request cannot be queued or cannot make its deadline.

        ``lead_ns``: time the request still needs before it can be submitted (its expected preprocess,
        including the wait for a preprocess worker), and what the server adds to its prediction (the slack).
        Every successful admit must be followed by exactly one ``submit`` or ``unreserve``."""
        shed = self.refusal(deadline_ns, now, lead_ns)
        if shed is not None:
            raise shed
        self._last_admit_ns = now
        self._reserved += 1

    def refusal(self, deadline_ns: int, now: int, lead_ns: int = 0) -> Shed | None:
        """The Shed ``admit`` would raise now, or None; reserves nothing and changes nothing.

        The server asks this from a request's headers before it decodes the body (serve/early.py), so that a
        refused request costs almost nothing on the core the compute runs on."""
        depth = self._queued + self._reserved
        if depth >= self.max_queue:
            return Shed("queue_full", max(0.1, self.model.predict(self.max_batch) * depth / self.max_batch))
        # the same margin the release plans with (timer granularity, hand-over, answer): an admission that
        # only fits without it would be released late and fail with a 504 instead of a clean 503 now
        finish = self.predicted_finish_ns(now) + lead_ns + self.margin_ns
        if finish > deadline_ns and not self.starved(now):
            return Shed("deadline", max(0.1, (finish - now) / 1e9))
        return None

    def nothing_ahead(self) -> bool:
        """Nothing queued, nothing admitted and not yet submitted, and a compute worker free: a request admitted
        now is computed next, and its prediction is its own cost alone (the server's ``admit_when_idle``)."""
        return self._queued == 0 and self._reserved == 0 and len(self._running) < self.workers

    def starved(self, now: int) -> bool:
        """Nothing admitted for ``probe_after_ns`` (since ``start`` if nothing ever was): the next request goes
        in whatever the prediction says."""
        since = self._last_admit_ns if self._last_admit_ns is not None else self._started_ns
        return since is not None and now - since > self.probe_after_ns

    def idle(self) -> bool:
        """Nothing queued, nothing else admitted and preprocessing, and a worker free (the caller's own admission
        is the one reservation allowed)."""
        return self._queued == 0 and self._reserved <= 1 and len(self._running) < self.workers

    def _cheapest_bucket(self) -> int:
        return min((b for b, m in self._models.items() if m.by_size), default=0)

    def unreserve(self) -> None:
        """Give back an admission that will not be submitted (its preprocess failed)."""
        self._reserved = max(0, self._reserved - 1)


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds (at least 1)."""
    return str(max(1, math.ceil(seconds)))

"""The P99 SLO guard and its fallback ladder.

The guard watches the end-to-end latency of every request a model serves and
moves the model along a *ladder* of levels, e.g. ``fp32 -> trunc64 -> int8
-> cache``: when the window quantile (P99 by default) of the current level
breaches the SLO it steps down to the next, lighter level; when requests
probed one level up come back fast enough it steps back up. Entering the last
level (typically ``cache``: answers from the result cache) raises an alarm,
leaving it clears the alarm.

Measurement. Each level keeps a sliding window of per-bucket HDR histograms
(``bucket_s`` wide, ``ceil(window_s / bucket_s)`` of them in a ring). A
level's window quantile is the quantile of the *merged* histograms of the
buckets inside the window: the exact HDR quantile of every sample of the last
``window_s`` seconds (to bucket granularity: the current bucket is partial),
never an average of per-bucket summaries. A bucket older than the window is
reset when its slot is reused, and ignored before that.

Decisions (``evaluate``, called periodically by the server):

* nothing happens until ``dwell_s`` has passed since the guard entered its
  current level (construction counts as entering level 0);
* DOWN: the current level's window holds >= ``min_samples`` samples and its
  quantile exceeds ``enter_ratio * slo_ms`` -> current + 1 (if there is one);
* UP: the level above holds >= ``probe_min_samples`` probe samples and their
  quantile is below ``exit_ratio * slo_ms`` -> current - 1, whether or not
  the current level is healthy. When both apply, DOWN wins.
* UP when quiet: probes come only with traffic, so a server left below the
  top when a burst ended would stay there (alarm raised, on ``cache``) until
  traffic returns. After a whole ``window_s`` at the current level with fewer
  than ``min_samples`` samples in its window (too few to have stepped down
  on: no evidence of a breach) and no probe of the level above breaching the
  SLO -> current - 1, one level per dwell, back to the top.

The gap between ``exit_ratio`` and ``enter_ratio`` is the hysteresis: a
latency hovering between the two moves the guard neither way.

Probes. While below the top, after the dwell, ``route`` sends a deterministic
1-in-N share of requests (N = ``round(1 / probe_fraction)``) one level up, so
the guard learns when the better level has recovered without betting all
traffic on it. A sample observed at ``current - 1`` counts as a probe once
probing has begun at the current level; responses that complete there
before that are stragglers routed before the step down, not probes.

Evidence is kept per stint: stepping DOWN into a level starts its window
empty, and stepping UP into a level starts its window from the probe samples
that justified the step, so samples from a level's earlier stint (taken under
another load and routing) never decide its fate. Stepping DOWN out of a level
discards its probe evidence, which the breach has just contradicted.

Switch time. ``first_served(level)`` is called by the server when a response
produced at ``level`` completes; the first one after a transition into that
level stamps the transition with its switch time (decision -> first response
at the new level), the figure the seeds' "within 200/100/50 ms" refers to.

All times come from the injected :class:`~latencylab.clock.Clock`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.histogram import LatencyHistogram

logger = logging.getLogger("latencylab.serve.guard")

MAX_BUCKETS = 1_000  # ring length cap: window_s / bucket_s beyond this is a configuration mistake
HISTORY = 1_000  # transitions kept in ``SloGuard.transitions`` (at most one per dwell_s, but servers run for weeks)
_HIST_HIGHEST_NS = 3_600_000_000_000  # one hour: anything longer is clamped (and still counted)


def _qlabel(q: float) -> str:
    """``0.99 -> 'p99'``, ``0.999 -> 'p99.9'``."""
    return f"p{q * 100:.10g}"


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Thresholds and timing of one model's SLO guard."""

    slo_ms: float  # latency objective at quantile q, in milliseconds
    q: float = 0.99  # quantile held to the SLO, a fraction in (0, 1)
    window_s: float = 10.0  # sliding window the quantile is taken over
    bucket_s: float = 1.0  # window granularity: one HDR histogram per level per bucket
    enter_ratio: float = 1.0  # step DOWN when the window quantile > enter_ratio * slo_ms
    exit_ratio: float = 0.7  # a level is healthy when its quantile < exit_ratio * slo_ms (hysteresis)
    dwell_s: float = 5.0  # minimum time at a level before any further step, down or up
    min_samples: int = 50  # no DOWN decision on fewer samples in the window
    probe_fraction: float = 0.05  # share of requests routed one level up as probes while below the top
    probe_min_samples: int = 30  # probes needed in the window before stepping UP

    def __post_init__(self) -> None:
        def finite(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise LatencyLabError(f"guard {name} must be a finite number, got {value!r}")
            return float(value)

        if not finite("slo_ms") > 0:
            raise LatencyLabError(f"guard slo_ms must be > 0, got {self.slo_ms!r}")
        if not 0 < finite("q") < 1:
            raise LatencyLabError(f"guard q must be a fraction in (0, 1) (0.99, not 99), got {self.q!r}")
        for name in ("window_s", "bucket_s", "enter_ratio", "exit_ratio"):
            if not finite(name) > 0:
                raise LatencyLabError(f"guard {name} must be > 0, got {getattr(self, name)!r}")
        if not finite("dwell_s") >= 0:
            raise LatencyLabError(f"guard dwell_s must be >= 0, got {self.dwell_s!r}")
        if self.bucket_s > self.window_s:
            raise LatencyLabError(f"guard bucket_s ({self.bucket_s}) must not exceed window_s ({self.window_s})")
        if self.n_buckets > MAX_BUCKETS:
            raise LatencyLabError(
                f"guard window_s / bucket_s must be <= {MAX_BUCKETS} buckets, got {self.window_s} / {self.bucket_s}"
            )
        if not self.exit_ratio < self.enter_ratio:
            raise LatencyLabError(
                f"guard exit_ratio ({self.exit_ratio}) must be below enter_ratio ({self.enter_ratio}): "
                "the gap between them is what stops the ladder flapping"
            )
        if not 0 < finite("probe_fraction") <= 0.5:
            raise LatencyLabError(f"guard probe_fraction must be in (0, 0.5], got {self.probe_fraction!r}")
        for name in ("min_samples", "probe_min_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LatencyLabError(f"guard {name} must be an integer >= 1, got {value!r}")

    @property
    def n_buckets(self) -> int:
        """Buckets in the ring: ``ceil(window_s / bucket_s)``."""
        return max(1, math.ceil(self.window_s / self.bucket_s - 1e-9))

    @property
    def probe_every(self) -> int:
        """N of the 1-in-N probe share: ``round(1 / probe_fraction)``."""
        return round(1.0 / self.probe_fraction)


@dataclass(frozen=True, slots=True)
class Transition:
    """One step of the ladder. ``at_s`` is clock seconds (the clock's own origin)."""

    at_s: float
    from_level: int
    to_level: int
    from_name: str
    to_name: str
    reason: str  # human-readable: the measured quantile and the threshold it crossed
    quantile_ms: float | None  # the quantile that decided (current level's for DOWN, the probes' for UP)
    switch_time_s: float | None = None  # decision -> first response at the new level (None until served)

    @property
    def direction(self) -> str:
        return "down" if self.to_level > self.from_level else "up"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "direction": self.direction}


@dataclass(frozen=True, slots=True)
class Alarm:
    """Raised (``active=True``) on entering the last level, cleared (``active=False``) on leaving it."""

    at_s: float
    active: bool
    level_name: str  # the last level's name, e.g. "cache"
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Window:
    """A ring of per-bucket histograms: slot ``b % n`` holds bucket ``b`` (samples with ``t // bucket_ns == b``).

    Histograms are created on first use (each is ~270 KB at ``lowest_ns=1``)
    and reset in place when their slot is reused for a newer bucket.
    """

    __slots__ = ("_bucket_ns", "_epochs", "_hists", "_n")

    def __init__(self, n: int, bucket_ns: int) -> None:
        self._n = n
        self._bucket_ns = bucket_ns
        self._hists: list[LatencyHistogram | None] = [None] * n
        self._epochs: list[int | None] = [None] * n

    def record(self, now_ns: int, latency_ns: int | float) -> None:
        b = now_ns // self._bucket_ns
        i = b % self._n
        h = self._hists[i]
        if h is None:
            h = self._hists[i] = LatencyHistogram(lowest_ns=1, highest_ns=_HIST_HIGHEST_NS)
        elif self._epochs[i] != b:
            h.reset()
        self._epochs[i] = b
        h.record(latency_ns)

    def _live(self, now_ns: int) -> list[LatencyHistogram]:
        cur = now_ns // self._bucket_ns
        out = []
        for h, b in zip(self._hists, self._epochs, strict=True):
            if h is not None and b is not None and cur - self._n < b <= cur and h.count:
                out.append(h)
        return out

    def merged(self, now_ns: int) -> LatencyHistogram | None:
        """All samples inside the window in one histogram (None when there are none)."""
        live = self._live(now_ns)
        return LatencyHistogram.merged(live) if live else None

    def count(self, now_ns: int) -> int:
        return sum(h.count for h in self._live(now_ns))

    def reset(self) -> None:
        self._epochs = [None] * self._n  # histograms are reset lazily when their slot is reused

    def copy_from(self, other: _Window) -> None:
        for i, (h, b) in enumerate(zip(other._hists, other._epochs, strict=True)):
            if h is None or b is None:
                self._epochs[i] = None
                continue
            mine = self._hists[i]
            if mine is None:
                self._hists[i] = h.copy()
            else:
                mine.reset()
                mine.merge(h)
            self._epochs[i] = b


class SloGuard:
    """Holds one model's window quantile under its SLO by moving along a ladder of levels.

    ``levels`` are in ladder order, best first, e.g. ``["fp32", "trunc64",
    "int8", "cache"]``. The server calls ``route()`` to pick the level of each
    request, ``observe()`` with its end-to-end latency, ``first_served()``
    when a response completes, and ``evaluate()`` periodically (every 100 ms,
    say). Thread-safe; ``on_alarm`` is called outside the guard's lock and
    its exceptions are logged, never raised.
    """

    def __init__(
        self,
        levels: Sequence[str],
        cfg: GuardConfig,
        clock: Clock | None = None,
        on_alarm: Callable[[Alarm], None] | None = None,
        *,
        name: str = "",
    ) -> None:
        names = tuple(levels)
        if not names:
            raise LatencyLabError("a guard needs at least one level")
        if len(set(names)) != len(names):
            raise LatencyLabError(f"guard levels must be distinct, got {list(names)}")
        self._names = names
        self._cfg = cfg
        self._clock: Clock = clock if clock is not None else PerfCounterClock()
        self._on_alarm = on_alarm
        self.name = name
        self._lock = threading.Lock()
        bucket_ns = max(1, round(cfg.bucket_s * 1e9))
        self._window = [_Window(cfg.n_buckets, bucket_ns) for _ in names]
        self._probes = [_Window(cfg.n_buckets, bucket_ns) for _ in names]
        self._dwell_ns = round(cfg.dwell_s * 1e9)
        self._window_ns = round(cfg.window_s * 1e9)
        self._probe_every = cfg.probe_every
        self._level = 0
        self._entered_ns = self._now_ns()
        self._routed = 0  # route() calls after the dwell at the current level
        self._probes_issued = 0  # probes handed out at the current level
        self._transitions: list[Transition] = []
        self._dropped = 0  # transitions trimmed from the front of the history
        self._pending: dict[int, tuple[int, int]] = {}  # level -> (transition seq, decision ns) awaiting a response
        self._alarm_active = False

    # -- introspection -----------------------------------------------------------------------

    def _now_ns(self) -> int:
        return int(self._clock.resolve([self._clock.mark()])[0])

    @property
    def config(self) -> GuardConfig:
        return self._cfg

    @property
    def levels(self) -> tuple[str, ...]:
        return self._names

    @property
    def level(self) -> int:
        """Index of the current level (0 = the top of the ladder)."""
        return self._level

    @property
    def level_name(self) -> str:
        return self._names[self._level]

    @property
    def alarm_active(self) -> bool:
        return self._alarm_active

    @property
    def transitions(self) -> list[Transition]:
        """Transitions so far, oldest first (the last ``HISTORY`` of them); a copy."""
        with self._lock:
            return list(self._transitions)

    def _label(self) -> str:
        return f"guard {self.name!r}" if self.name else "guard"

    # -- the request path --------------------------------------------------------------------

    def route(self) -> int:
        """The level that should serve the next request.

        The current level, except that below the top and after the dwell,
        every N-th call (N = ``round(1 / probe_fraction)``) returns
        ``current - 1``: a probe.
        """
        with self._lock:
            level = self._level
            if level == 0 or self._now_ns() - self._entered_ns < self._dwell_ns:
                return level
            self._routed += 1
            if self._routed % self._probe_every:
                return level
            self._probes_issued += 1
            return level - 1

    def observe(self, level: int, latency_ns: int | float, *, probe: bool | None = None) -> None:
        """Record the end-to-end latency of a request served at ``level`` (probes included).

        ``probe=None`` infers whether it was a probe: served at ``current - 1``
        after probing began at the current level. A caller that knows (it kept
        what ``route()`` said) can pass ``probe`` explicitly; only probes of
        ``current - 1`` can step the guard up.
        """
        self._check_level(level)
        with self._lock:
            now = self._now_ns()
            self._window[level].record(now, latency_ns)
            is_probe = level == self._level - 1 and self._probes_issued > 0 if probe is None else probe
            if is_probe:
                self._probes[level].record(now, latency_ns)

    def first_served(self, level: int) -> float | None:
        """Switch time (s) if this is the first response at ``level`` since a transition into it, else None."""
        self._check_level(level)
        with self._lock:
            pending = self._pending.pop(level, None)
            if pending is None:
                return None
            seq, at_ns = pending
            switch_s = (self._now_ns() - at_ns) / 1e9
            i = seq - self._dropped
            if 0 <= i < len(self._transitions):
                self._transitions[i] = replace(self._transitions[i], switch_time_s=switch_s)
        logger.info(
            "%s: first response at %s %.1f ms after the decision", self._label(), self._names[level], switch_s * 1e3
        )
        return switch_s

    def _check_level(self, level: int) -> None:
        if not 0 <= level < len(self._names):
            raise ValueError(f"level {level} is not in 0..{len(self._names) - 1}")

    # -- decisions ---------------------------------------------------------------------------

    def evaluate(self) -> Transition | None:
        """Apply the DOWN/UP rules (module docstring) now; return the transition made, if any."""
        cfg = self._cfg
        slo = cfg.slo_ms
        ql = _qlabel(cfg.q)
        alarm: Alarm | None = None
        with self._lock:
            now = self._now_ns()
            if now - self._entered_ns < self._dwell_ns:
                return None
            cur = self._level
            made: Transition | None = None
            if cur + 1 < len(self._names):
                h = self._window[cur].merged(now)
                if h is not None and h.count >= cfg.min_samples:
                    q_ms = h.quantile(cfg.q) / 1e6
                    if q_ms > cfg.enter_ratio * slo:
                        reason = (
                            f"{ql} {q_ms:.2f} ms at {self._names[cur]} > {cfg.enter_ratio * slo:.2f} ms "
                            f"({cfg.enter_ratio:g} x SLO {slo:g} ms) over {h.count} requests"
                        )
                        made, alarm = self._step(now, cur + 1, reason, q_ms)
            if made is None and cur > 0:
                p = self._probes[cur - 1].merged(now)
                if p is not None and p.count >= cfg.probe_min_samples:
                    q_ms = p.quantile(cfg.q) / 1e6
                    if q_ms < cfg.exit_ratio * slo:
                        reason = (
                            f"probe {ql} {q_ms:.2f} ms at {self._names[cur - 1]} < {cfg.exit_ratio * slo:.2f} ms "
                            f"({cfg.exit_ratio:g} x SLO {slo:g} ms) over {p.count} probes"
                        )
                        made, alarm = self._step(now, cur - 1, reason, q_ms)
            if made is None and cur > 0 and now - self._entered_ns >= self._window_ns:
                made, alarm = self._quiet_step_up(now, cur)
        if made is not None:
            log = logger.warning if made.direction == "down" else logger.info
            log("%s: %s -> %s: %s", self._label(), made.from_name, made.to_name, made.reason)
        if alarm is not None:
            self._emit(alarm)
        return made

    def _quiet_step_up(self, now: int, cur: int) -> tuple[Transition | None, Alarm | None]:
        """UP when quiet (module docstring; lock held): the current level's window holds too few samples to
        judge, and no probe of the level above breaches."""
        cfg = self._cfg
        h = self._window[cur].merged(now)
        n = 0 if h is None else h.count
        if n >= cfg.min_samples:
            return None, None
        p = self._probes[cur - 1].merged(now)
        if p is not None and p.quantile(cfg.q) / 1e6 > cfg.enter_ratio * cfg.slo_ms:
            return None, None
        reason = (
            f"quiet: {n} request(s) at {self._names[cur]} in the last {cfg.window_s:g} s (< {cfg.min_samples}), "
            "no evidence of a breach"
        )
        return self._step(now, cur - 1, reason, None)

    def _step(self, now: int, to: int, reason: str, q_ms: float | None) -> tuple[Transition, Alarm | None]:
        """Move to level ``to`` (lock held); returns the transition and the alarm change it causes."""
        frm = self._level
        t = Transition(now / 1e9, frm, to, self._names[frm], self._names[to], reason, q_ms)
        seq = self._dropped + len(self._transitions)
        self._transitions.append(t)
        if len(self._transitions) > HISTORY:
            del self._transitions[0]
            self._dropped += 1
        self._pending.pop(frm, None)  # a switch into the level we leave never completed
        self._pending[to] = (seq, now)
        if to > frm:
            self._probes[frm].reset()  # the breach contradicts any earlier probe evidence for it
            self._window[to].reset()
        else:
            self._window[to].copy_from(self._probes[to])
            self._probes[to].reset()
        self._level = to
        self._entered_ns = now
        self._routed = 0
        self._probes_issued = 0
        last = len(self._names) - 1
        alarm = None
        if to == last and not self._alarm_active:
            self._alarm_active = True
            message = f"{self._names[frm]} breached its SLO ({reason}); now serving from {self._names[last]}"
            alarm = Alarm(t.at_s, True, self._names[last], message)
        elif frm == last and self._alarm_active:
            self._alarm_active = False
            message = f"recovered ({reason}); now serving from {self._names[to]}"
            alarm = Alarm(t.at_s, False, self._names[last], message)
        return t, alarm

    def _emit(self, alarm: Alarm) -> None:
        if alarm.active:
            logger.error("%s: ALARM: %s", self._label(), alarm.message)
        else:
            logger.warning("%s: alarm cleared: %s", self._label(), alarm.message)
        if self._on_alarm is None:
            return
        try:
            self._on_alarm(alarm)
        except Exception:
            logger.exception("%s: alarm callback failed", self._label())

    # -- reporting ---------------------------------------------------------------------------

    def window_quantile(self, level: int) -> float | None:
        """The window quantile (ms) of everything served at ``level``; None without samples."""
        self._check_level(level)
        with self._lock:
            h = self._window[level].merged(self._now_ns())
        return None if h is None else h.quantile(self._cfg.q) / 1e6

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state: level, per-level window quantile and counts, alarm, transitions."""
        q = self._cfg.q
        with self._lock:
            now = self._now_ns()
            per_level = []
            for i, name in enumerate(self._names):
                h = self._window[i].merged(now)
                p = self._probes[i].merged(now)
                per_level.append(
                    {
                        "name": name,
                        "window_count": 0 if h is None else h.count,
                        "window_quantile_ms": None if h is None else h.quantile(q) / 1e6,
                        "probe_count": 0 if p is None else p.count,
                        "probe_quantile_ms": None if p is None else p.quantile(q) / 1e6,
                    }
                )
            return {
                "level": self._level,
                "level_name": self._names[self._level],
                "at_level_s": (now - self._entered_ns) / 1e9,
                "slo_ms": self._cfg.slo_ms,
                "q": q,
                "alarm": self._alarm_active,
                "levels": per_level,
                "transitions_total": self._dropped + len(self._transitions),
                "transitions": [t.to_dict() for t in self._transitions],
            }


def webhook_notifier(url: str, timeout_s: float = 2.0) -> Callable[[Alarm], None]:
    """An ``on_alarm`` callback that POSTs each alarm as JSON to ``url``.

    Each POST runs in its own daemon thread, so the caller (the guard, on the
    server's control path) never waits for the receiver; failures (refused
    connection, timeout, non-2xx status) are logged as warnings, never raised.
    The body is ``Alarm.to_dict()`` plus ``"source": "latencylab"``.
    """
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise LatencyLabError(f"alarm webhook must be an http(s) URL, got {url!r}")
    if not timeout_s > 0:
        raise LatencyLabError(f"alarm webhook timeout must be > 0, got {timeout_s!r}")

    def post(body: bytes) -> None:
        req = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "latencylab"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                resp.read()
        except Exception as exc:  # urllib raises URLError, HTTPError, OSError, timeouts...
            logger.warning("alarm webhook %s failed: %s", url, exc)

    def notify(alarm: Alarm) -> None:
        try:
            body = json.dumps({"source": "latencylab", **alarm.to_dict()}).encode()
            threading.Thread(target=post, args=(body,), name="latencylab-alarm-webhook", daemon=True).start()
        except Exception as exc:  # e.g. no thread can be started: the alarm is still logged by the guard
            logger.warning("alarm webhook %s not sent: %s", url, exc)

    return notify

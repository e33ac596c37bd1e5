"""The stage profiler: runs a Pipeline with warm-up and a stopping rule.

Per iteration it takes one clock mark before the first stage and one after
each stage, so stage i's duration is mark[i+1] - mark[i] and the end-to-end
latency is mark[last] - mark[0] (the stage durations add up exactly). The
input for iteration i is produced by ``pipeline.source(i)`` before the first
mark (not timed).

Stopping rules (ProfileConfig):

* ``iterations=N``: exactly N timed iterations.
* ``min_time_s=S``: until S seconds of timed iterations and at least
  ``min_iterations``.
* ``adaptive=True``: until the end-to-end ``target_q`` quantile has enough
  tail samples and its distribution-free confidence interval is within
  +/- ``target_rel_ci`` of the estimate, or ``max_time_s`` is reached
  (the stop reason says which). Checked at geometrically spaced counts so the
  check costs O(n log n) in total.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab import stats
from latencylab.clock import Clock, clock_for_device
from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.results import ProfileResult, StageSeries

ProgressFn = Callable[[int, float, int], None]  # (iterations done, elapsed s, last end-to-end ns)


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """How long to run and when to stop. Exactly one of iterations / min_time_s / adaptive applies."""

    warmup: int = 10
    iterations: int | None = None
    min_time_s: float | None = None
    adaptive: bool = False
    max_time_s: float = 120.0
    min_iterations: int = 20
    target_q: float = 0.99
    target_rel_ci: float = 0.05
    confidence: float = 0.95
    threads: int | None = None

    def __post_init__(self) -> None:
        chosen = sum([self.iterations is not None, self.min_time_s is not None, self.adaptive])
        if chosen > 1:
            raise LatencyLabError("choose one stopping rule: iterations, min-time or adaptive")
        if self.warmup < 0:
            raise LatencyLabError(f"warmup must be >= 0, got {self.warmup}")
        if self.iterations is not None and self.iterations < 1:
            raise LatencyLabError(f"iterations must be >= 1, got {self.iterations}")
        if self.min_time_s is not None and not self.min_time_s > 0:
            raise LatencyLabError(f"min-time must be > 0 seconds, got {self.min_time_s}")
        if not self.max_time_s > 0:
            raise LatencyLabError(f"max-time must be > 0 seconds, got {self.max_time_s}")
        if not 0 < self.target_q < 1:
            raise LatencyLabError(f"target quantile must be a fraction in (0, 1), got {self.target_q}")
        if not 0 < self.target_rel_ci < 1:
            raise LatencyLabError(f"target CI half-width must be in (0, 1), got {self.target_rel_ci}")
        if not 0 < self.confidence < 1:
            raise LatencyLabError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.threads is not None and self.threads < 1:
            raise LatencyLabError(f"threads must be >= 1, got {self.threads}")

    @property
    def rule(self) -> str:
        if self.iterations is not None:
            return "iterations"
        if self.min_time_s is not None:
            return "min_time"
        if self.adaptive:
            return "adaptive"
        return "min_time"

    def effective_min_time(self) -> float:
        return self.min_time_s if self.min_time_s is not None else 5.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rule"] = self.rule
        return d


def apply_threads(threads: int | None) -> None:
    """Set intra-op threads for the libraries in use (torch if imported)."""
    if threads is None:
        return
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


class _Stopper:
    """Decides, at check points, whether to stop, and when to look next.

    The hot loop only compares an integer with ``next_check``; time and
    statistics are read at check points spaced ~10 ms of run time apart (time
    rules) or geometrically (the adaptive p99 check), so checking costs
    nothing per iteration.
    """

    CHECK_EVERY_S = 0.01

    def __init__(self, cfg: ProfileConfig) -> None:
        self.cfg = cfg
        self.rule = cfg.rule
        self.need = stats.samples_needed(cfg.target_q)
        self.next_stat = max(cfg.min_iterations, 50)
        self.last_rel = float("nan")
        self.next_check: int = cfg.iterations if cfg.iterations is not None else 1

    def check(self, n: int, elapsed: float, e2e: Callable[[], npt.NDArray[np.int64]], last_ns: int) -> str:
        cfg = self.cfg
        if self.rule == "iterations":
            return "iterations reached" if n >= (cfg.iterations or 0) else ""
        self.next_check = n + max(1, int(self.CHECK_EVERY_S * 1e9 / max(last_ns, 1)))
        if self.rule == "min_time":
            if elapsed >= cfg.effective_min_time() and n >= cfg.min_iterations:
                return f"min-time {cfg.effective_min_time():g}s reached"
            return ""
        # adaptive
        if elapsed >= cfg.max_time_s:
            return (
                f"time cap {cfg.max_time_s:g}s reached before the "
                f"{stats.format_q(cfg.target_q)} CI was within "
                f"+/-{cfg.target_rel_ci:.0%} (last: +/-{self.last_rel:.1%}, n={n})"
            )
        if n < self.next_stat or n < self.need:
            self.next_check = min(self.next_check, max(self.next_stat, self.need))
            return ""
        self.next_stat = int(n * 1.25) + 1
        self.next_check = min(self.next_check, self.next_stat)
        srt = np.sort(e2e().astype(np.float64))
        est = float(np.quantile(srt, cfg.target_q))
        lo, hi = stats.order_stat_ci(srt, cfg.target_q, cfg.confidence)
        self.last_rel = (hi - lo) / 2 / est if est > 0 else 0.0
        if self.last_rel <= cfg.target_rel_ci:
            return (
                f"adaptive: {stats.format_q(cfg.target_q)} {cfg.confidence:.0%} CI within "
                f"+/-{self.last_rel:.1%} after {n} iterations"
            )
        return ""


def profile(
    pipeline: Pipeline,
    config: ProfileConfig | None = None,
    clock: Clock | None = None,
    env: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> ProfileResult:
    """Time every stage of ``pipeline`` and return the raw samples as a ProfileResult.

    ``clock`` defaults to the right clock for ``pipeline.device`` (CUDA events
    on a GPU). ``env`` defaults to a fresh environment fingerprint.
    """
    cfg = config or ProfileConfig()
    pipeline.validate()
    apply_threads(cfg.threads)
    clk = clock if clock is not None else clock_for_device(pipeline.device)
    if env is None:
        from latencylab.env import fingerprint

        env = fingerprint()
    fns = [s.fn for s in pipeline.stages]
    source = pipeline.source
    mark = clk.mark
    resolve = clk.resolve

    probe = pipeline.probe
    for i in range(cfg.warmup):
        x = source(i)
        for fn in fns:
            x = fn(x)
        if probe is not None:
            probe(i)  # warm-up facts are discarded, but the probe sees every iteration
    metas: list[Mapping[str, Any]] = []

    # Hot loop: one mark per boundary, one list append per iteration; differences
    # are taken afterwards with numpy.
    rows: list[Any] = []
    stopper = _Stopper(cfg)
    host = time.perf_counter_ns
    t_begin = host()
    last_progress = t_begin
    reason = ""
    n = 0

    def e2e() -> npt.NDArray[np.int64]:
        arr = np.asarray(rows, dtype=np.int64)
        return arr[:, -1] - arr[:, 0]

    while not reason:
        x = source(cfg.warmup + n)
        marks = [mark()]
        for fn in fns:
            x = fn(x)
            marks.append(mark())
        rows.append(resolve(marks))
        if probe is not None:
            metas.append(probe(cfg.warmup + n))
        n += 1
        if n >= stopper.next_check:
            now = host()
            last_ns = rows[-1][-1] - rows[-1][0]
            reason = stopper.check(n, (now - t_begin) / 1e9, e2e, last_ns)
            if progress is not None and now - last_progress > 100_000_000:
                progress(n, (now - t_begin) / 1e9, last_ns)
                last_progress = now
    wall = (host() - t_begin) / 1e9
    if pipeline.close is not None:
        pipeline.close()
    ts = np.asarray(rows, dtype=np.int64)
    durations = np.diff(ts, axis=1)
    if progress is not None:
        progress(n, wall, int(ts[-1, -1] - ts[-1, 0]))
    if durations.size and durations.min() < 0:
        j = int(np.argmin(durations.min(axis=0)))
        raise LatencyLabError(f"clock {clk.name} went backwards in stage {pipeline.stages[j].name!r}")
    starts = ts[:, 0] - ts[0, 0]
    return ProfileResult(
        workload=pipeline.name,
        stages=tuple(
            StageSeries(s.name, s.kind, tuple(durations[:, j].tolist())) for j, s in enumerate(pipeline.stages)
        ),
        iteration_start_ns=tuple(starts.tolist()),
        clock=clk.name,
        config=cfg.to_dict(),
        pipeline=dict(pipeline.describe()),
        env=env,
        stop_reason=reason,
        warmup_iterations=cfg.warmup,
        wall_time_s=wall,
        iteration_meta=_columns(metas),
    )


def _columns(metas: list[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Per-iteration probe dicts -> key -> one value per iteration (None where an iteration lacked the key)."""
    keys: dict[str, None] = {}
    for m in metas:
        keys.update(dict.fromkeys(m))
    return {k: tuple(m.get(k) for m in metas) for k in keys}

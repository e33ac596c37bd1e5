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

Runs (``ProfileConfig.runs``): the whole warm-up + stopping rule is repeated
that many times and the results concatenated, with the machine canary read
before, between and after the runs. A run, not an iteration, is the unit two
measurements of one program differ by (the host's speed moves between runs),
so ``compare`` sets its noise floor from the spread between runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab import stats
from latencylab.autoprobe import AutoProbe
from latencylab.autoprobe import enabled as autoprobe_enabled
from latencylab.canary import Canary, MachineCanary, Reading, default_canary_enabled, summarize
from latencylab.clock import Clock, FakeClock, clock_for_device
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
    runs: int = 1  # separate runs (own warm-up and stopping rule each); compare's unit of variation

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
        if self.runs < 1:
            raise LatencyLabError(f"runs must be >= 1, got {self.runs}")

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


BeforeRun = Callable[[int, int], None]  # (pipeline index, run index): called before each run's warm-up


@dataclass(slots=True)
class _Block:
    """One run of one pipeline: warm-up, then timed iterations until the stopping rule says stop."""

    rows: list[Any]
    metas: list[Mapping[str, Any]]
    reason: str
    wall_s: float


def _run_block(
    pipeline: Pipeline,
    cfg: ProfileConfig,
    clk: Clock,
    progress: Callable[[int, float, int], None] | None,
    auto: AutoProbe | None = None,
) -> _Block:
    fns = [s.fn for s in pipeline.stages]
    source = pipeline.source
    mark = clk.mark
    resolve = clk.resolve
    probe = pipeline.probe
    # Every run replays the same inputs (warm-up 0..warmup-1, then warmup, warmup+1, ...), so runs differ
    # only by the machine and the process state: the between-run spread is the noise floor compare uses.
    for i in range(cfg.warmup):
        x = source(i)
        for fn in fns:
            x = fn(x)
        if probe is not None:
            probe(i)  # warm-up facts are discarded, but the probe sees every iteration
    metas: list[Mapping[str, Any]] = []
    watch = auto.watcher(pipeline) if auto is not None else None  # autoprobe.py: shapes, inputs, compiles

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
        if watch is None:
            for fn in fns:
                x = fn(x)
                marks.append(mark())
        else:
            xs = [x]  # every stage's input, looked at after the last mark
            for fn in fns:
                x = fn(x)
                marks.append(mark())
                xs.append(x)
        rows.append(resolve(marks))
        if watch is not None:
            metas.append(watch.observe(xs, probe(cfg.warmup + n) if probe is not None else None))
        elif probe is not None:
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
    if progress is not None:
        progress(n, wall, int(rows[-1][-1] - rows[-1][0]))
    return _Block(rows, metas, reason, wall)


def _canary_for(canary: Canary | bool | None, clocks: Sequence[Clock]) -> Canary | None:
    """None (automatic): the machine canary, unless every clock is fake (a fake clock's run does not happen
    on machine time, so the machine's speed is no part of it) or LATENCYLAB_CANARY=0."""
    if canary is False:
        return None
    if canary is None or canary is True:
        from latencylab.clock import FakeClock

        if canary is None and (all(isinstance(c, FakeClock) for c in clocks) or not default_canary_enabled()):
            return None
        return MachineCanary()
    return canary


def profile(
    pipeline: Pipeline,
    config: ProfileConfig | None = None,
    clock: Clock | None = None,
    env: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    canary: Canary | bool | None = None,
    before_run: BeforeRun | None = None,
) -> ProfileResult:
    """Time every stage of ``pipeline`` and return the raw samples as a ProfileResult.

    ``clock`` defaults to the right clock for ``pipeline.device`` (CUDA events
    on a GPU). ``env`` defaults to a fresh environment fingerprint. With
    ``config.runs`` > 1 the pipeline is measured in that many runs, one after
    the other, each with its own warm-up and stopping rule, and the machine
    canary is read before, between and after them (``profile_interleaved``).
    ``canary``: None reads the machine canary unless the clock is fake; False
    never; a :class:`~latencylab.canary.Canary` is used as given.
    ``before_run(0, run)`` is called before each run (tests change the
    machine's speed there).
    """
    return profile_interleaved([pipeline], config, clock, env, progress, canary, before_run=before_run)[0]


def profile_interleaved(
    pipelines: Sequence[Pipeline],
    config: ProfileConfig | None = None,
    clock: Clock | None = None,
    env: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    canary: Canary | bool | None = None,
    seed: int = 0,
    before_run: BeforeRun | None = None,
) -> list[ProfileResult]:
    """Measure several pipelines in ``config.runs`` rounds of randomised blocks; one result per pipeline.

    Algorithm: each round runs every pipeline once (one *run*: its own warm-up, then timed iterations
    until the stopping rule), in an order drawn afresh each round (numpy seed ``seed``), so a drift of the
    machine's speed lands on every pipeline alike and run r of one pipeline is paired with run r of the
    others (compare's paired test, ``latencylab compare --run A B``). The canary is read before the first
    round, between rounds and after the last; every result carries the same ``env.canary``. The rows of
    all runs are concatenated in each result; ``iteration_run`` says which run an iteration belongs to and
    ``runs`` describes each run. One pipeline and ``runs`` = 1 is the plain ``profile``.
    """
    cfg = config or ProfileConfig()
    if not pipelines:
        raise LatencyLabError("nothing to profile: no pipeline")
    for p in pipelines:
        p.validate()
    apply_threads(cfg.threads)
    clocks = [
        clock if clock is not None else p.clock if p.clock is not None else clock_for_device(p.device)
        for p in pipelines
    ]
    if env is None:
        from latencylab.env import fingerprint

        env = fingerprint()
    can = _canary_for(canary, clocks)
    auto = AutoProbe() if autoprobe_enabled() and not all(isinstance(c, FakeClock) for c in clocks) else None
    readings: list[Reading] = []
    if can is not None:
        readings.append(can.read("before"))
    blocks: list[list[_Block]] = [[] for _ in pipelines]
    positions: list[list[int]] = [[] for _ in pipelines]
    rng = np.random.default_rng(seed)
    done = [0] * len(pipelines)
    t0 = time.perf_counter_ns()
    for r in range(cfg.runs):
        order = rng.permutation(len(pipelines)) if len(pipelines) > 1 else np.zeros(1, dtype=np.int64)
        for pos, k in enumerate(order.tolist()):
            if before_run is not None:
                before_run(k, r)
            cb = None
            if progress is not None:
                base = done[k]

                def cb(n: int, _elapsed: float, last_ns: int, base: int = base) -> None:
                    assert progress is not None
                    progress(base + n, (time.perf_counter_ns() - t0) / 1e9, last_ns)

            blk = _run_block(pipelines[k], cfg, clocks[k], cb, auto)
            blocks[k].append(blk)
            positions[k].append(pos)
            done[k] += len(blk.rows)
        if can is not None:
            readings.append(can.read("after" if r == cfg.runs - 1 else "between"))
    for p in pipelines:
        if p.close is not None:
            p.close()
    if can is not None:
        env = {**env, "canary": summarize(readings)}
    session = None
    if len(pipelines) > 1:
        session = {
            "session": f"{t0:x}-{seed}",
            "pipelines": [p.name for p in pipelines],
            "order": "randomised blocks",
            "seed": seed,
        }
    results = [_result(p, cfg, clocks[k], env, blocks[k], positions[k], session, k) for k, p in enumerate(pipelines)]
    return results if auto is None else [auto.finish(r, p) for r, p in zip(results, pipelines, strict=True)]


def _result(
    pipeline: Pipeline,
    cfg: ProfileConfig,
    clk: Clock,
    env: dict[str, Any],
    blocks: Sequence[_Block],
    positions: Sequence[int],
    session: Mapping[str, Any] | None,
    side: int,
) -> ProfileResult:
    ts = np.concatenate([np.asarray(b.rows, dtype=np.int64) for b in blocks])
    durations = np.diff(ts, axis=1)
    if durations.size and durations.min() < 0:
        j = int(np.argmin(durations.min(axis=0)))
        raise LatencyLabError(f"clock {clk.name} went backwards in stage {pipeline.stages[j].name!r}")
    starts = ts[:, 0] - ts[0, 0]
    metas = [m for b in blocks for m in b.metas]
    config = cfg.to_dict()
    if session is not None:
        config["interleaved"] = {**session, "side": side}
    runs: tuple[dict[str, Any], ...] = ()
    run_of: tuple[int, ...] = ()
    if len(blocks) > 1:
        first = 0
        info = []
        for r, (b, pos) in enumerate(zip(blocks, positions, strict=True)):
            info.append(
                {
                    "run": r,
                    "n": len(b.rows),
                    "start_s": round(int(starts[first]) / 1e9, 6),
                    "wall_time_s": b.wall_s,
                    "stop_reason": b.reason,
                    "position": pos,
                }
            )
            first += len(b.rows)
        runs = tuple(info)
        run_of = tuple(r for r, b in enumerate(blocks) for _ in range(len(b.rows)))
    reasons = list(dict.fromkeys(b.reason for b in blocks))
    reason = reasons[0] if len(blocks) == 1 else f"{len(blocks)} runs: " + "; ".join(reasons)
    return ProfileResult(
        workload=pipeline.name,
        stages=tuple(
            StageSeries(s.name, s.kind, tuple(durations[:, j].tolist())) for j, s in enumerate(pipeline.stages)
        ),
        iteration_start_ns=tuple(starts.tolist()),
        clock=clk.name,
        config=config,
        pipeline=dict(pipeline.describe()),
        env=env,
        stop_reason=reason,
        warmup_iterations=cfg.warmup,
        wall_time_s=sum(b.wall_s for b in blocks),
        iteration_meta=_columns(metas),
        iteration_run=run_of,
        runs=runs,
    )


def _columns(metas: list[Mapping[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Per-iteration probe dicts -> key -> one value per iteration (None where an iteration lacked the key)."""
    keys: dict[str, None] = {}
    for m in metas:
        keys.update(dict.fromkeys(m))
    return {k: tuple(m.get(k) for m in metas) for k in keys}

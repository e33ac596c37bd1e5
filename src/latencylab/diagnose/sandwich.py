"""The "sandwich method" (``diagnose --deep``): stage -> system -> operator, narrowing down at each layer.

1. **Stage** (tracing layer): the stage profile says which stage takes the largest share of end-to-end time.
2. **System** (monitoring layer): CPU per core, context switches, page faults, a memory-bandwidth proxy and
   GPU utilisation (NVML, when present), sampled by :class:`~latencylab.diagnose.sysmetrics.Sampler` during
   the profiled run, say whether the machine is saturated, contended or idle while that stage runs.
3. **Operator** (code layer): ``torch.profiler`` over that stage only (its inputs are prepared first by
   running the stages before it, untimed), sorted by self time: the guilty operators. A stage with no torch
   operators (a JPEG decoder, a tokenizer) is profiled with ``cProfile`` instead, and its top functions are
   reported, so the layer never comes back empty.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from latencylab.diagnose.sysmetrics import Sampler, SystemMetrics
from latencylab.findings import Evidence, Finding
from latencylab.pipeline import Pipeline
from latencylab.profiler import ProfileConfig, profile
from latencylab.results import ProfileResult

TOP = 8
MIN_OPERATOR_COVERAGE = 0.1  # torch ops must explain at least 10% of the stage, else fall back to cProfile


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    self_ms_per_call: float  # self time per stage call
    share: float  # of the stage's wall time under the profiler
    calls: int  # per stage call
    file: str = ""  # cProfile rows: the source file of the function ("" for torch operators and builtins)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "self_ms_per_call": self.self_ms_per_call,
            "share": self.share,
            "calls": self.calls,
            "file": self.file,
        }

    @property
    def user_code(self) -> bool:
        """A function of the user's: Python source outside the interpreter's library, site-packages and latencylab."""
        return bool(self.file) and not any(self.file.startswith(p) for p in _LIBRARY_DIRS) and "<" not in self.name


def _library_dirs() -> tuple[str, ...]:
    import sysconfig
    from pathlib import Path

    import latencylab

    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(latencylab.__file__).resolve().parent))
    return tuple(sorted(dirs))


_LIBRARY_DIRS = _library_dirs()


def user_function(ops: list[Operator]) -> Operator | None:
    """The user's own Python function with the most self time among ``ops`` (cProfile rows), or None."""
    return next((o for o in ops if o.user_code), None)


def _stage_inputs(pipe: Pipeline, index: int, n: int, start: int) -> list[Any]:
    """Inputs of stage ``index`` for iterations start..start+n-1: the stages before it run untimed."""
    out = []
    for i in range(start, start + n):
        x = pipe.source(i)
        for s in pipe.stages[:index]:
            x = s.fn(x)
        out.append(x)
    return out


def torch_operators(fn: Callable[[Any], Any], inputs: list[Any], device: str = "cpu") -> tuple[list[Operator], float]:
    """(operators sorted by self time, the fraction of the stage's wall time they explain) via torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    if on_gpu:
        activities.append(ProfilerActivity.CUDA)
    fn(inputs[0])  # warm: lazy initialisation is not the stage's steady state
    with torch.profiler.profile(activities=activities) as prof:
        t = time.perf_counter()
        for x in inputs:
            fn(x)
        if on_gpu:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t) * 1e6
    calls = len(inputs)
    ops = []
    for e in prof.key_averages():
        self_us = float(e.self_cpu_time_total)
        if on_gpu:
            self_us = max(self_us, float(getattr(e, "self_device_time_total", 0.0) or 0.0))
        if self_us <= 0:
            continue
        ops.append(Operator(str(e.key), self_us / calls / 1e3, self_us / wall_us, round(e.count / calls)))
    ops.sort(key=lambda o: -o.self_ms_per_call)
    covered = sum(o.share for o in ops)
    return ops, covered


def python_functions(fn: Callable[[Any], Any], inputs: list[Any]) -> list[Operator]:
    """Top functions by own time (cProfile), for stages that run no torch operators."""
    fn(inputs[0])
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    for x in inputs:
        fn(x)
    pr.disable()
    wall_s = time.perf_counter() - t
    st = pstats.Stats(pr)
    calls = len(inputs)
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        where = func if file == "~" else f"{func} ({file.rsplit('/', 1)[-1]}:{line})"
        share = tt / wall_s if wall_s > 0 else 0.0
        rows.append(Operator(where, tt / calls * 1e3, share, round(nc / calls), "" if file == "~" else file))
    rows.sort(key=lambda o: -o.self_ms_per_call)
    return rows


def _system_finding(stage: str, summary: dict[str, Any], source: str) -> Finding:
    ev = []
    sev = "info"
    notes = []
    if "cpu_mean_per_core" in summary:
        ev.append(
            Evidence(
                "CPU utilisation per core (mean)", ", ".join(f"{v:.0f}" for v in summary["cpu_mean_per_core"]), "%"
            )
        )
        ev.append(Evidence("busiest core (mean)", summary["cpu_busiest_core"], "%"))
        ev.append(Evidence("this process CPU (100% = one core)", summary["process_cpu_mean"], "%"))
        ev.append(Evidence("involuntary context switches", summary["ctx_involuntary_per_s"], "/s"))
        ev.append(Evidence("minor page faults", summary["minor_faults_per_s"], "/s"))
        if summary["ctx_involuntary_per_s"] > 200:
            sev = "warning"
            notes.append(
                "threads are preempted often (involuntary context switches): too many threads or a busy machine"
            )
    if "bandwidth_available_ratio" in summary:
        ratio = summary["bandwidth_available_ratio"]
        ev.append(Evidence("copy bandwidth idle", summary["bandwidth_idle_gbps"], "GB/s"))
        ev.append(Evidence("copy bandwidth during the run (median)", summary["bandwidth_during_gbps"], "GB/s"))
        ev.append(Evidence("bandwidth still available (during / idle)", ratio, "x"))
        if ratio < 0.5:
            sev = "warning"
            notes.append("memory bandwidth is under pressure: the run leaves less than half of it to one more core")
    if "gpu_util_mean" in summary:
        ev.append(
            Evidence("GPU utilisation per device (mean)", ", ".join(f"{v:.0f}" for v in summary["gpu_util_mean"]), "%")
        )
        idle = max(summary["gpu_idle_fraction"])
        ev.append(Evidence("GPU idle samples (< 5% busy)", round(100 * idle, 1), "%"))
        if idle > 0.5:
            sev = "warning"
            notes.append("the GPU is idle most of the time while the pipeline is busy: copies or host work block it")
    else:
        ev.append(Evidence("GPU utilisation", "not sampled (no NVML / pynvml or no GPU)"))
    ev.append(Evidence("samples", summary.get("samples", 0)))
    title = f"system during the run (slowest stage {stage}): " + (
        "; ".join(notes)
        if notes
        else f"CPU {summary.get('cpu_mean', 0):.0f}% mean over cores, no saturation or contention flagged"
    )
    return Finding(
        rule="sandwich-system",
        severity=sev,
        title=title,
        evidence=tuple(ev),
        recommendation=(
            "compare with the stage: a saturated core during a single-threaded stage means that stage is CPU-bound "
            "(move it or parallelise it); low utilisation everywhere means the pipeline waits (I/O, locks, copies); "
            "preemption or bandwidth pressure points at thread counts and co-located work"
        ),
        source=source,
        details=summary,
    )


def stage_inputs(pipe: Pipeline, stage: str, n: int = 20) -> tuple[Any, list[Any]]:
    """(the stage's function, ``n`` inputs for it prepared by running the stages before it untimed)."""
    index = [s.name for s in pipe.stages].index(stage)
    return pipe.stages[index].fn, _stage_inputs(pipe, index, n, start=10_000)


def run_sandwich(
    pipe: Pipeline,
    result: ProfileResult | None = None,
    metrics: SystemMetrics | None = None,
    *,
    source: str = "live run",
    profile_s: float = 2.0,
    op_calls: int = 20,
    top: int = TOP,
) -> list[Finding]:
    """The three layers on ``pipe``; profiles it (under the system sampler) unless ``result``/``metrics`` are given."""
    if result is None or metrics is None:
        with Sampler() as sampler:
            run = profile(pipe, ProfileConfig(warmup=5, min_time_s=profile_s))
        result = result or run
        metrics = sampler.metrics
    totals = {s.name: float(s.array().sum()) for s in result.stages}
    whole = sum(totals.values()) or 1.0
    slow = max(result.stages, key=lambda s: totals[s.name])
    share = totals[slow.name] / whole
    mean_ms = float(slow.array().mean()) / 1e6
    findings = [
        Finding(
            rule="sandwich-stage",
            severity="info",
            title=f"slowest stage: {slow.name} ({slow.kind}), {share:.0%} of end-to-end time, {mean_ms:.3f} ms mean",
            evidence=tuple(
                Evidence(f"{s.name} share", round(100 * totals[s.name] / whole, 1), "%")
                for s in sorted(result.stages, key=lambda s: -totals[s.name])
            ),
            recommendation=f"the next layers look inside {slow.name}: system metrics, then its operators",
            source=source,
            details={"stage": slow.name, "share": share},
        ),
        _system_finding(slow.name, metrics.summary(), source),
    ]
    index = [s.name for s in pipe.stages].index(slow.name)
    inputs = _stage_inputs(pipe, index, op_calls, start=10_000)
    fn = pipe.stages[index].fn
    method = "torch.profiler"
    try:
        ops, covered = torch_operators(fn, inputs, pipe.device)
    except ImportError:
        ops, covered = [], 0.0
    if covered < MIN_OPERATOR_COVERAGE:
        method = "cProfile (no torch operators cover this stage)"
        ops = python_functions(fn, inputs)
    shown = ops[:top]
    if shown:
        head = ", ".join(f"{o.name} {o.share:.0%}" for o in shown[:3])
        title = f"top operators in {slow.name} ({method.split(' ')[0]}): {head}"
    else:
        title = f"no operators recorded in {slow.name}"
    findings.append(
        Finding(
            rule="sandwich-operators",
            severity="info",
            title=title,
            evidence=tuple(
                Evidence(
                    f"{o.name} (x{o.calls}/call, {o.share:.1%} of the stage)", round(o.self_ms_per_call, 4), "ms/call"
                )
                for o in shown
            ),
            recommendation=(
                "start with the operator at the top: fuse it with its neighbours, change its precision or layout, "
                "or replace the library call; an allocator, copy or format-conversion operator near the top means "
                "memory management, not arithmetic, is the cost"
            ),
            source=source,
            details={"stage": slow.name, "method": method, "operators": [o.to_dict() for o in shown]},
        )
    )
    return findings

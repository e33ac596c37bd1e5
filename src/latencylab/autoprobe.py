"""What the profiler records by itself, with no code from the user, so ``diagnose`` needs no hints.

The profiler already passes every stage's input through its hands; while it times a pipeline it keeps
them until the iteration's last mark and then (outside the timed region) looks at them:

Per timed iteration (columns of ``ProfileResult.iteration_meta``; a key the pipeline's own ``probe``
writes wins, and a column that says nothing is dropped: constant, all zero, or never repeating):

* ``shape``: the shape of the input of the *watched stage*: the first stage of kind ``forward`` whose input
  has one, else the last stage whose input has one. An input has a shape when it is an array or a tensor
  (anything with ``.shape`` and ``.dtype``), or a mapping / tuple / list holding one (a tokenizer's
  ``BatchEncoding``, ``{"input_ids": ..., "attention_mask": ...}``, ``(x,)``): ``input_ids`` first,
  then ``pixel_values``, then the first array-like value.
* ``lengths``: real tokens per item, the row sums of an ``attention_mask`` in that input.
* ``input``: which distinct input the source produced (0, 1, 2, ... in order of first appearance), from a
  small content fingerprint of ``source(i)``'s output (strings and bytes hashed; arrays and CPU tensors by
  shape, dtype and 64 evenly spaced elements; mappings and sequences element-wise). Kept only when inputs
  repeat: it lets ``diagnose`` tell "latency cycles because the inputs cycle" from a rhythm of the system.
* ``compiles`` / ``compile_s``: torch.compile compile events during the iteration, the change of TorchDynamo's
  ``counters["frames"]["ok"]`` and of the summed ``_compile.compile_inner`` times; read only when
  ``torch._dynamo`` is already imported (this module never imports torch).

Per run (a profile's ``env`` and ``pipeline`` sections):

* ``env.after_warmup.threads``: thread settings read again after the first warm-up (a pipeline that calls
  ``torch.set_num_threads`` on its first forward call changes them after the fingerprint was taken).
* ``env.run``: what the machine did while the run lasted, on the CPUs of this process's affinity mask
  (``/proc/stat``): other processes' CPU (busy time minus this process's own, in cores and as a fraction of
  the CPUs), steal time, this process's CPU and its involuntary context switches per second. ``env.lint``
  judges "busy" by these, not by the 1-minute load average (which counts the profiler itself).
* ``pipeline.observed``: where the columns came from (the watched stage, the mask key).

Cost: one list append per stage per timed iteration (the stage inputs are kept until the last mark,
~20 ns each, charged to the next stage like the profiler's own mark); everything else runs between
iterations, untimed. Disabled for fake clocks and with ``LATENCYLAB_AUTOPROBE=0``.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latencylab.pipeline import Pipeline
    from latencylab.results import ProfileResult

AUTO_KEYS = ("shape", "lengths", "input", "compiles", "compile_s")
SAMPLE = 64  # elements of an array read into its fingerprint
MAX_ITEMS = 64  # a longer sequence is fingerprinted by its length and three elements
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# busy-machine thresholds (env.lint "busy"), measured during the run
BUSY_OTHERS_FRACTION = 0.25  # other processes used a quarter of this process's CPUs
BUSY_STEAL = 0.05
BUSY_PREEMPTIONS_PER_S = 200.0  # a single-threaded run preempted this often shares its core


def enabled() -> bool:
    return os.environ.get("LATENCYLAB_AUTOPROBE", "1") not in ("0", "false", "no", "off")


# ------------------------------------------------------------------------------------------ inputs
def _array_shape(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, (str, bytes)) or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return None
    try:
        shape = tuple(int(d) for d in x.shape)
    except (TypeError, ValueError):
        return None
    return shape if shape else None


def _main_array(x: Any) -> Any:
    """The array that carries an input's shape (see the module docstring), or None."""
    if _array_shape(x) is not None:
        return x
    if isinstance(x, Mapping) or (hasattr(x, "keys") and hasattr(x, "__getitem__") and not isinstance(x, type)):
        try:
            keys = list(x.keys())
        except Exception:
            return None
        for k in ("input_ids", "pixel_values", "input_values", "inputs_embeds"):
            if k in keys and _array_shape(x[k]) is not None:
                return x[k]
        for k in keys:
            if _array_shape(x[k]) is not None:
                return x[k]
        return None
    if isinstance(x, (tuple, list)) and 0 < len(x) <= MAX_ITEMS:
        for v in x:
            if _array_shape(v) is not None:
                return v
    return None


def input_shape(x: Any) -> list[int] | None:
    """The shape of a stage input (array, tensor, or a mapping / sequence holding one), or None."""
    arr = _main_array(x)
    shape = _array_shape(arr) if arr is not None else None
    return list(shape) if shape is not None else None


def input_lengths(x: Any) -> list[int] | None:
    """Real tokens per item: the row sums of an ``attention_mask`` (2-D: one per row; 1-D: one), or None."""
    if not (isinstance(x, Mapping) or hasattr(x, "keys")):
        return None
    try:
        mask: Any = x.get("attention_mask") if hasattr(x, "get") else None
    except Exception:
        return None
    shape = _array_shape(mask) if mask is not None else None
    if mask is None or shape is None or len(shape) > 2:
        return None
    try:
        if hasattr(mask, "detach"):  # torch: sum on its device, one small copy back
            sums = mask.detach().sum(dim=-1).cpu().reshape(-1).tolist()
        else:
            import numpy as np

            sums = np.asarray(mask).sum(axis=-1).reshape(-1).tolist()
    except Exception:
        return None
    return [int(v) for v in sums]


def _array_key(x: Any, shape: tuple[int, ...]) -> Any:
    size = 1
    for d in shape:
        size *= d
    dtype = str(getattr(x, "dtype", ""))
    if size == 0:
        return ("array", shape, dtype)
    step = max(1, size // SAMPLE)
    try:
        if hasattr(x, "detach"):  # torch
            if x.device.type != "cpu":
                return ("array", shape, dtype, "device")  # reading it would synchronise the device
            flat = x.detach().reshape(-1)
            sample = flat[::step][:SAMPLE].numpy().tobytes()
        else:
            import numpy as np

            a = np.asarray(x)
            sample = a.reshape(-1)[::step][:SAMPLE].tobytes() if a.flags.c_contiguous else a.flat[::step].tobytes()
    except Exception:
        return None
    return ("array", shape, dtype, hash(sample))


def input_key(x: Any, depth: int = 0) -> Any:
    """A small hashable fingerprint of an input's content, or None when its type is not understood."""
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return (type(x).__name__, hash(x))
    shape = _array_shape(x)
    if shape is not None:
        return _array_key(x, shape)
    if depth > 3:
        return None
    if isinstance(x, Mapping):
        items = list(x.items())[:MAX_ITEMS]
        keys = tuple((str(k), input_key(v, depth + 1)) for k, v in items)
        return None if any(k[1] is None for k in keys) else ("map", len(x), keys)
    if isinstance(x, (tuple, list)):
        picked = x if len(x) <= MAX_ITEMS else [x[0], x[len(x) // 2], x[-1]]
        keys2 = tuple(input_key(v, depth + 1) for v in picked)
        return None if any(k is None for k in keys2) else ("seq", len(x), keys2)
    size, mode = getattr(x, "size", None), getattr(x, "mode", None)
    if isinstance(size, tuple) and isinstance(mode, str) and hasattr(x, "getpixel"):  # a PIL image
        w, h = size
        try:
            px = tuple(x.getpixel((w * k // 9, h * k // 9)) for k in range(9)) if w and h else ()
        except Exception:
            return None
        return ("image", size, mode, px)
    return None


# ------------------------------------------------------------------------------------------ compiles
def compile_state() -> tuple[int, float] | None:
    """(TorchDynamo frames compiled, seconds spent in compile_inner) so far; None when dynamo is not imported."""
    if "torch._dynamo" not in sys.modules:
        return None
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except Exception:
        return None
    try:
        frames = int(counters["frames"]["ok"])
        secs = float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
    except Exception:
        return None
    return frames, secs


# ------------------------------------------------------------------------------------------ threads
def threads_now() -> dict[str, Any]:
    """Thread settings now: the env vars and, when torch is already imported, its intra/inter-op threads."""
    out: dict[str, Any] = {"env": {v: os.environ.get(v) for v in _THREAD_VARS}}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["torch_intra_op"] = int(torch.get_num_threads())
            out["torch_inter_op"] = int(torch.get_num_interop_threads())
        except Exception:
            pass
    return out


# ------------------------------------------------------------------------------------------ machine
def _cpus() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cpu_ticks(cpus: frozenset[int] | None = None, path: str = "/proc/stat") -> list[list[int]] | None:
    """The tick counters (user, nice, system, idle, iowait, irq, softirq[, steal, ...]) of each CPU in ``cpus``
    (all when None), from the ``cpuN`` lines of /proc/stat; None where the file cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    rows: list[list[int]] = []
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            idx, v = int(name[3:]), [int(x) for x in fields]
        except ValueError:
            continue
        if (cpus is not None and idx not in cpus) or len(v) < 7:
            continue
        rows.append(v)
    return rows


def _proc_stat(cpus: frozenset[int] | None) -> tuple[int, int, int, int] | None:
    """(busy ticks without steal, steal ticks, all ticks, CPUs counted) over ``cpus`` from /proc/stat."""
    rows = cpu_ticks(cpus)
    if not rows:
        return None
    busy = sum(v[0] + v[1] + v[2] + v[5] + v[6] for v in rows)
    steal = sum(v[7] if len(v) > 7 else 0 for v in rows)
    total = sum(sum(v[:8]) for v in rows)
    return busy, steal, total, len(rows)


class RunMeter:
    """Counts what the machine did between ``start`` and ``stop`` (the ``env.run`` section)."""

    def __init__(self) -> None:
        self.cpus = _cpus()
        self.t0 = time.perf_counter()
        self.stat0 = _proc_stat(self.cpus)
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)

    def stop(self) -> dict[str, Any]:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self_s = (ru.ru_utime - self.ru0.ru_utime) + (ru.ru_stime - self.ru0.ru_stime)
        out: dict[str, Any] = {
            "wall_s": round(wall, 3),
            "self_cpu_cores": round(self_s / wall, 3),
            "involuntary_switches_per_s": round((ru.ru_nivcsw - self.ru0.ru_nivcsw) / wall, 1),
        }
        stat1 = _proc_stat(self.cpus)
        if self.stat0 is not None and stat1 is not None and stat1[3] == self.stat0[3]:
            try:
                tick = float(os.sysconf("SC_CLK_TCK"))
            except (ValueError, OSError, AttributeError):
                tick = 100.0
            busy_s = (stat1[0] - self.stat0[0]) / tick
            steal, total = stat1[1] - self.stat0[1], stat1[2] - self.stat0[2]
            others = max(0.0, busy_s - self_s) / wall
            out.update(
                {
                    "cpus": stat1[3],
                    "others_cpu_cores": round(others, 3),
                    "others_cpu_fraction": round(min(1.0, others / stat1[3]), 3),
                    "steal_fraction": round(steal / total, 4) if total > 0 else 0.0,
                }
            )
        return out


def busy_verdict(fp: Mapping[str, Any]) -> tuple[bool, str] | None:
    """(busy?, message) judged by what was measured during the run (``env.run``); None when not measured.

    Busy: other processes used >= ``BUSY_OTHERS_FRACTION`` of this process's CPUs, or steal >=
    ``BUSY_STEAL``, or a single-threaded run (< 1.2 cores of its own) was preempted more than
    ``BUSY_PREEMPTIONS_PER_S`` times a second. The 1-minute load average is quoted, never judged.
    """
    run = fp.get("run")
    if not isinstance(run, Mapping) or "others_cpu_fraction" not in run:
        return None
    others, frac = float(run["others_cpu_cores"]), float(run["others_cpu_fraction"])
    steal = float(run.get("steal_fraction") or 0.0)
    pre = float(run.get("involuntary_switches_per_s") or 0.0)
    single = float(run.get("self_cpu_cores") or 0.0) < 1.2
    busy = frac >= BUSY_OTHERS_FRACTION or steal >= BUSY_STEAL or (single and pre >= BUSY_PREEMPTIONS_PER_S)
    load_sec = fp.get("load")
    load: Mapping[str, Any] = load_sec if isinstance(load_sec, Mapping) else {}
    msg = (
        f"{'machine is busy' if busy else 'machine was quiet'} during the run: other processes used {others:.2f} "
        f"of {run['cpus']} CPUs ({frac:.0%}), steal {steal:.1%}, this process was preempted {pre:.0f} times/s"
        f" (1-min load average {load.get('loadavg_1')}, for reference)"
    )
    return busy, msg


# ------------------------------------------------------------------------------------------ watching
class Watcher:
    """Watches one pipeline's timed iterations (one per profiler run): ``observe`` after each iteration."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.kinds = [s.kind for s in pipeline.stages]
        self.names = [s.name for s in pipeline.stages]
        self.stage: int | None = None  # index of the watched stage, chosen on the first iteration
        self.inputs: dict[Any, int] = {}
        self.track_inputs = True
        self.compile_last = compile_state()
        self.user_keys: frozenset[str] = frozenset()  # what the pipeline's own probe writes (never dropped)
        self._seen_meta = False

    def _choose(self, xs: Sequence[Any]) -> int | None:
        shaped = [j for j in range(len(self.kinds)) if input_shape(xs[j]) is not None]
        fwd = [j for j in shaped if self.kinds[j] == "forward"]
        return fwd[0] if fwd else (shaped[-1] if shaped else None)

    def observe(self, xs: Sequence[Any], meta: Mapping[str, Any] | None) -> dict[str, Any]:
        """Facts of one iteration: ``xs`` = [stage 0 input, stage 1 input, ..., last output]; ``meta`` = the
        pipeline probe's own facts (kept, and winning over these)."""
        out: dict[str, Any] = {}
        if self.stage is None:
            chosen = self._choose(xs)
            self.stage = -1 if chosen is None else chosen
        if self.stage is not None and self.stage >= 0:
            x = xs[self.stage]
            out["shape"] = input_shape(x)
            lens = input_lengths(x)
            if lens is not None:
                out["lengths"] = lens
        if self.track_inputs:
            key = input_key(xs[0])
            if key is None:
                self.track_inputs = False
            else:
                out["input"] = self.inputs.setdefault(key, len(self.inputs))
        state = compile_state()
        if state is not None:
            last = self.compile_last or (state[0], state[1])
            out["compiles"] = state[0] - last[0]
            out["compile_s"] = round(state[1] - last[1], 6)
            self.compile_last = state
        if meta:
            if not self._seen_meta:
                self.user_keys, self._seen_meta = frozenset(meta), True
            out.update(meta)
        return out

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.stage is not None and self.stage >= 0:
            d["shape_stage"] = self.names[self.stage]
            d["shape_of"] = f"input of stage {self.names[self.stage]!r}"
        return d


def _useful(key: str, col: Sequence[Any]) -> bool:
    if key in ("compiles", "compile_s"):
        return any(isinstance(v, (int, float)) and v > 0 for v in col)
    if key == "input":
        ids = [v for v in col if v is not None]
        return len(ids) == len(col) and 1 < len(set(ids)) <= len(ids) // 2  # several inputs, repeating
    if key in ("shape", "lengths"):
        return any(v is not None for v in col) and len({repr(v) for v in col}) > 1
    return True


class AutoProbe:
    """One profiling session: a :class:`Watcher` per pipeline, the run meter, the threads after warm-up."""

    def __init__(self) -> None:
        self.meter = RunMeter()
        self.after_warmup: dict[str, Any] | None = None
        self.watchers: dict[int, Watcher] = {}
        self._run: dict[str, Any] | None = None

    def watcher(self, pipeline: Pipeline) -> Watcher:
        """Called after a run's warm-up: the pipeline's watcher (its compile counter re-based)."""
        if self.after_warmup is None:
            self.after_warmup = {"threads": threads_now()}
        w = self.watchers.get(id(pipeline))
        if w is None:
            w = self.watchers[id(pipeline)] = Watcher(pipeline)
        w.compile_last = compile_state()  # compiles during warm-up are not the timed run's
        return w

    def finish(self, result: ProfileResult, pipeline: Pipeline) -> ProfileResult:
        """The result with ``env.run``, ``env.after_warmup`` and ``pipeline.observed`` added and the
        automatic columns that say nothing dropped (the pipeline probe's own columns are kept as they are)."""
        if self._run is None:
            self._run = self.meter.stop()
        w = self.watchers.get(id(pipeline))
        own = w.user_keys if w is not None else frozenset()
        meta = {k: v for k, v in result.iteration_meta.items() if k in own or k not in AUTO_KEYS or _useful(k, v)}
        env = {**result.env, "run": self._run}
        if self.after_warmup is not None:
            env["after_warmup"] = self.after_warmup
        pipe = dict(result.pipeline)
        observed = w.describe() if w is not None else {}
        observed = {k: v for k, v in observed.items() if "shape" in meta or not k.startswith("shape")}
        if observed:
            pipe["observed"] = observed
        return replace(result, env=env, pipeline=pipe, iteration_meta=meta)

"""Environment fingerprint, lint and diff: does the test machine match production?

`fingerprint()` reads the machine (CPU, memory, load, OS, Python, libraries, thread settings, GPU, process)
into a plain JSON-serialisable dict; every reading degrades to None or "not exposed" instead of raising.
`lint()` turns a fingerprint into warnings about things that make latency numbers noisy or unrepresentative;
`diff()` lists the differences between two fingerprints that can change latency. Both are pure functions of
the dicts, so they work on fingerprints loaded from other machines' result files.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import psutil

from latencylab.errors import LatencyLabError

if TYPE_CHECKING:
    from rich.console import Console

FINGERPRINT_VERSION = 1
NOT_EXPOSED = "not exposed"
Impact = Literal["high", "medium", "low"]

_SYS_CPU = Path("/sys/devices/system/cpu")
# ISA extensions that decide which kernels oneDNN/MLAS/ORT pick; the other /proc/cpuinfo flags are noise.
_ISA_FLAGS = {
    *("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx_vnni_int8", "avx512f", "avx512bw"),
    *("avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512_vbmi"),
    *("amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm"),
}
_LIBRARIES = (
    *("torch", "onnxruntime", "onnx", "numpy", "transformers", "tokenizers", "scikit-learn", "pillow"),
    "latencylab",
)
# Numeric thread counts. ORT reads no env var itself; the ORT_* names are latencylab's convention.
_THREAD_VARS = (
    *("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS"),
    *("ORT_INTRA_OP_NUM_THREADS", "ORT_INTER_OP_NUM_THREADS"),
)
_ENV_VARS = [*_THREAD_VARS, "OPENBLAS_CORETYPE"]


# --------------------------------------------------------------------------------------------- readers
def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _read_int(path: str | Path) -> int | None:
    try:
        return int(_read(path) or "")
    except ValueError:
        return None


def _safe(call: Callable[[], Any]) -> Any:
    """call(), or None if it raises: optional probes (torch, NVML) must never break the fingerprint."""
    try:
        return call()
    except Exception:
        return None


def _cpuinfo() -> tuple[str | None, set[str]]:
    model: str | None = None
    flags: set[str] = set()
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if model is None and key in ("model name", "Processor", "cpu model"):
            model = value or None
        elif not flags and key in ("flags", "Features"):  # x86 / arm64
            flags = set(value.split())
    return model, flags


def _governor() -> str:
    # All CPUs normally share one governor; a mix is reported as "a,b" so that lint still flags it.
    found = {g for p in _SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_governor") if (g := _read(p))}
    return ",".join(sorted(found)) if found else NOT_EXPOSED


def _frequency() -> dict[str, Any] | None:
    khz = {k: _read_int(_SYS_CPU / f"cpu0/cpufreq/scaling_{k}_freq") for k in ("cur", "min", "max")}
    boost = _read_int(_SYS_CPU / "cpufreq/boost")  # acpi-cpufreq, amd-pstate
    no_turbo = _read_int(_SYS_CPU / "intel_pstate/no_turbo")
    turbo = bool(boost) if boost is not None else (not no_turbo if no_turbo is not None else None)
    if turbo is None and all(v is None for v in khz.values()):
        return None
    freq: dict[str, Any] = {f"{k}_mhz": (v // 1000 if v is not None else None) for k, v in khz.items()}
    return {**freq, "turbo": turbo}


def _torch(probe: bool) -> ModuleType | None:
    """torch if already imported (free), or if probing was asked for (the import takes seconds)."""
    if "torch" in sys.modules or probe:
        return _safe(partial(importlib.import_module, "torch"))  # None if absent or broken
    return None


def _cpu(model: str | None, flags: set[str], torch: ModuleType | None) -> dict[str, Any]:
    logical, physical = os.cpu_count(), psutil.cpu_count(logical=False)
    active = _read_int(_SYS_CPU / "smt/active")
    smt = bool(active) if active is not None else (logical > physical if logical and physical else None)
    cpu: dict[str, Any] = {
        "model": model,
        "logical_cpus": logical,
        "physical_cores": physical,
        "smt": smt,
        "isa": sorted(flags & _ISA_FLAGS),
        "governor": _governor(),
        "frequency": _frequency(),
        # The CPUs this process may run on (taskset, cgroups): what thread counts must fit into.
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical,
    }
    if torch is not None:  # the kernel family torch really dispatches to, e.g. "AVX2" or "AVX512"
        cpu["torch_capability"] = _safe(lambda: str(torch.backends.cpu.get_cpu_capability()))
    return cpu


def _load(sample_s: float) -> dict[str, Any]:
    try:
        avg: list[float | None] = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        avg = [None, None, None]
    cpu_percent = psutil.cpu_percent(interval=sample_s)
    return {"loadavg_1": avg[0], "loadavg_5": avg[1], "loadavg_15": avg[2], "cpu_percent": cpu_percent}


def _os(flags: set[str]) -> dict[str, Any]:
    distro = None
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            distro = line.partition("=")[2].strip().strip("\"'") or None
    virt = None
    if "hypervisor" in flags:
        vendor = _read("/sys/class/dmi/id/sys_vendor")
        virt = f"hypervisor ({vendor})" if vendor else "hypervisor"
    u = platform.uname()
    return {
        "system": u.system,
        "release": u.release,
        "machine": u.machine,
        "distro": distro,
        "virtualization": virt,
    }


def _python() -> dict[str, Any]:
    gil = getattr(sys, "_is_gil_enabled", None)  # 3.13+; False on a free-threaded build with the GIL off
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "build": list(platform.python_build()),
        "compiler": platform.python_compiler(),
        "debug_build": hasattr(sys, "gettotalrefcount"),
        "executable": sys.executable,
        "gil_enabled": bool(gil()) if callable(gil) else None,
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        if dist == "latencylab":  # run from a source tree that is not pip-installed
            from latencylab import __version__

            return __version__
        return None


def _threads(torch: ModuleType | None) -> dict[str, Any]:
    return {
        "env": {var: os.environ.get(var) for var in _ENV_VARS},
        "torch_intra_op": _safe(lambda: int(torch.get_num_threads())) if torch else None,
        "torch_inter_op": _safe(lambda: int(torch.get_num_interop_threads())) if torch else None,
    }


def _gpu_torch(torch: ModuleType) -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"name": p.name, "capability": f"{p.major}.{p.minor}", "total_memory_bytes": p.total_memory})
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"devices": devices, "cuda_version": torch.version.cuda, "cudnn_version": cudnn}


def _gpu_nvml() -> dict[str, Any] | None:
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # pynvml not installed, no driver, or no device
        return None
    try:
        devices = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            # Each field separately: NVML answers NotSupported for many of them on consumer or virtual GPUs.
            dev: dict[str, Any] = {"name": _text(_safe(partial(nv.nvmlDeviceGetName, h)))}
            for key, clock in (("sm", nv.NVML_CLOCK_SM), ("mem", nv.NVML_CLOCK_MEM)):
                dev[f"{key}_clock_mhz"] = _safe(partial(nv.nvmlDeviceGetClockInfo, h, clock))
                dev[f"{key}_max_clock_mhz"] = _safe(partial(nv.nvmlDeviceGetMaxClockInfo, h, clock))
            power_mw = _safe(partial(nv.nvmlDeviceGetPowerManagementLimit, h))
            dev["power_limit_w"] = power_mw / 1000 if power_mw is not None else None
            persistence = _safe(partial(nv.nvmlDeviceGetPersistenceMode, h))
            dev["persistence_mode"] = bool(persistence) if persistence is not None else None
            devices.append(dev)
        return {"driver_version": _text(_safe(nv.nvmlSystemGetDriverVersion)), "devices": devices}
    except Exception:
        return None
    finally:
        _safe(nv.nvmlShutdown)


def _text(value: Any) -> str | None:
    """NVML strings: str in current pynvml/nvidia-ml-py, bytes in old releases."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _process() -> dict[str, Any]:
    trace = sys.gettrace()
    # coverage (on 3.11) installs its tracer with sys.settrace too; that is not a debugger.
    coverage_tracer = trace is not None and type(trace).__module__.startswith("coverage")
    coverage = False
    if "coverage" in sys.modules:
        current = getattr(getattr(sys.modules["coverage"], "Coverage", None), "current", None)
        coverage = current() is not None if callable(current) else coverage_tracer
    debugger = "pydevd" in sys.modules or (trace is not None and not coverage_tracer)
    return {"debugger": debugger, "coverage": coverage, "pid": os.getpid()}


def fingerprint(sample_s: float = 0.1, probe_torch: bool = False) -> dict[str, Any]:
    """Read this machine into a JSON-serialisable dict (sections: see the module docstring).

    `sample_s` is how long CPU utilisation is sampled (0 compares with the previous psutil call).
    torch thread counts and torch.cuda are read only if torch is already imported or `probe_torch` is set,
    because importing torch takes seconds; library versions come from package metadata, not imports.
    """
    torch = _torch(probe_torch)
    model, flags = _cpuinfo()
    vm = psutil.virtual_memory()
    gpu_torch = _safe(lambda: _gpu_torch(torch)) if torch is not None else None
    nvml = _gpu_nvml()
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": _cpu(model, flags, torch),
        "memory": {"total_bytes": int(vm.total), "available_bytes": int(vm.available)},
        "load": _load(sample_s),
        "os": _os(flags),
        "python": _python(),
        "libraries": {name: _version(name) for name in _LIBRARIES},
        "threads": _threads(torch),
        "gpu": {"torch": gpu_torch, "nvml": nvml} if gpu_torch or nvml else None,
        "process": _process(),
    }


# ------------------------------------------------------------------------------------------------ lint
@dataclass(frozen=True, slots=True)
class EnvWarning:
    """Something that makes latency numbers noisy or unrepresentative: what is wrong, and what to do."""

    code: str
    message: str
    hint: str


def _get(fp: dict[str, Any], path: str) -> Any:
    node: Any = fp
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _oversubscribed(fp: dict[str, Any]) -> list[str]:
    cpus = _int(_get(fp, "cpu.affinity")) or _int(_get(fp, "cpu.logical_cpus"))
    if not cpus:
        return []
    over = [f"{v}={n}" for v in _THREAD_VARS if (n := _int(_get(fp, f"threads.env.{v}"))) and n > cpus]
    # Inter-op threads only run concurrent ops (torch.jit.fork); torch's default intra x inter
    # exceeds the CPUs on every machine, so flagging it would be a false alarm on every run.
    intra = _int(_get(fp, "threads.torch_intra_op"))
    if intra and intra > cpus:
        over.append(f"torch intra-op threads={intra}")
    return [f"{item} > {cpus} usable CPUs" for item in over]


# Yes/no facts: (code, fingerprint path that is true when it applies, message, hint).
_FLAG_CHECKS = (
    ("debugger", "process.debugger", "a debugger or trace function is attached: every line pays for it",
     "measure outside the debugger"),
    ("coverage", "process.coverage", "coverage measurement is active: Python code runs several times slower",
     "measure without coverage"),
    ("debug-build", "python.debug_build", "Python is a debug build: the interpreter is several times slower",
     "use a release build of Python"),
    ("smt", "cpu.smt", "SMT (hyper-threading) is on: sibling threads share a core, so per-thread speed "
     "depends on what runs beside it", "pin one thread per physical core, or disable SMT"),
)  # fmt: skip


def lint(fp: dict[str, Any]) -> list[EnvWarning]:
    """Warnings for a fingerprint; a pure function of the dict, tolerant of missing sections."""
    out: list[EnvWarning] = []
    governor = _get(fp, "cpu.governor")
    if governor in (None, NOT_EXPOSED):
        msg = "CPU frequency governor not exposed (typical in a VM): cannot check that clocks are pinned"
        out.append(EnvWarning("governor-unknown", msg, "on bare metal, check the host uses 'performance'"))
    elif governor != "performance":
        msg = f"CPU frequency governor is '{governor}': clocks ramp up and down with load, adding variance"
        out.append(EnvWarning("governor", msg, "sudo cpupower frequency-set -g performance"))
    logical = _int(_get(fp, "cpu.logical_cpus")) or 1
    load1, busy = _get(fp, "load.loadavg_1"), _get(fp, "load.cpu_percent")
    from latencylab.autoprobe import busy_verdict  # a profile result: judged by what the run measured

    if (measured := busy_verdict(fp)) is not None:
        if measured[0]:
            out.append(EnvWarning("busy", measured[1], "stop other jobs, or measure on an idle machine"))
    elif (load1 is not None and load1 > 0.5 * logical) or (busy is not None and busy > 30):
        msg = f"machine is busy: 1-min load average {load1} on {logical} CPUs, CPU utilisation {busy}%"
        out.append(EnvWarning("busy", msg, "stop other jobs, or measure on an idle machine"))
    if over := _oversubscribed(fp):
        msg = "more threads than CPUs, so threads contend and tails grow: " + "; ".join(over)
        hint = "set thread counts (and torch.set_num_interop_threads) to at most the CPUs in the affinity"
        out.append(EnvWarning("oversubscription", msg, hint))
    freq = _get(fp, "cpu.frequency") or {}
    lo, hi, turbo = freq.get("min_mhz"), freq.get("max_mhz"), freq.get("turbo")
    if turbo or (lo is not None and hi is not None and lo != hi):
        msg = f"frequency scaling is active (turbo {turbo}, {lo}-{hi} MHz): clock varies with heat and load"
        out.append(EnvWarning("turbo", msg, "disable boost/turbo and pin min = max frequency"))
    steal = _get(fp, "canary.steal_fraction")
    if isinstance(steal, (int, float)) and steal > 0.05:  # canary.STEAL_WARN
        msg = f"the hypervisor took {steal:.0%} of the CPU time while this was measured (steal time)"
        out.append(EnvWarning("steal", msg, "measure on a dedicated host or a quieter time; compare interleaved"))
    out += [EnvWarning(code, msg, hint) for code, path, msg, hint in _FLAG_CHECKS if _get(fp, path) is True]
    return out


# ------------------------------------------------------------------------------------------------ diff
@dataclass(frozen=True, slots=True)
class EnvDifference:
    """One latency-relevant field that differs between two fingerprints."""

    path: str
    a: Any
    b: Any
    impact: Impact


# The longest matching prefix decides (list indices match "*"); None, or no match at all, means the field
# is volatile or does not change latency, so it is ignored (load, available memory, created_at, pid, ...).
_IMPACT: dict[str, Impact | None] = {
    **dict.fromkeys(("cpu.model", "cpu.isa", "cpu.torch_capability", "cpu.affinity"), "high"),
    **dict.fromkeys(("cpu.logical_cpus", "cpu.physical_cores", "gpu", "threads"), "high"),
    **dict.fromkeys(("libraries.torch", "libraries.onnxruntime", "os.machine", "python.version"), "high"),
    **dict.fromkeys(("python.implementation", "python.debug_build", "python.gil_enabled"), "high"),
    **dict.fromkeys(("cpu.governor", "cpu.frequency", "cpu.smt", "os.release", "libraries"), "medium"),
    **dict.fromkeys(("memory.total_bytes", "os", "python"), "low"),
    **dict.fromkeys(("cpu.frequency.cur_mhz", "python.executable"), None),
    **dict.fromkeys(("gpu.nvml.devices.*.sm_clock_mhz", "gpu.nvml.devices.*.mem_clock_mhz"), None),
    "canary": None,  # readings are volatile field by field; diff() compares the canary as a whole instead
}


# Read only when torch was imported or probed, so None there means "not read", not "absent".
_PROBED = {"cpu.torch_capability", "threads.torch_intra_op", "threads.torch_inter_op"}


def _impact(path: str, a: Any, b: Any) -> Impact | None:
    parts = ["*" if p.isdigit() else p for p in path.split(".")]
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in _IMPACT:
            if prefix == "python.version" and str(a).split(".")[:2] == str(b).split(".")[:2]:
                return "low"  # a patch release rarely moves latency; a minor one can (10-15%)
            return _IMPACT[prefix]
    return None


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        for i, value in enumerate(node):
            yield from _flatten(value, f"{prefix}.{i}")
    else:
        yield prefix, node


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[EnvDifference]:
    """Latency-relevant differences from `a` to `b`, high impact first; volatile readings are ignored."""
    flat_a, flat_b = dict(_flatten(a)), dict(_flatten(b))
    out = []
    for path in flat_a.keys() | flat_b.keys():
        va, vb = flat_a.get(path), flat_b.get(path)  # a field missing on one side reads as None
        if path in _PROBED and (va is None or vb is None):
            continue  # read on one side only: unknown, not different
        if va != vb and (impact := _impact(path, va, vb)) is not None:
            out.append(EnvDifference(path, va, vb, impact))
    if (speed := canary_difference(a, b)) is not None:
        out.append(speed)
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(out, key=lambda d: (order[d.impact], d.path))


def canary_difference(a: dict[str, Any], b: dict[str, Any]) -> EnvDifference | None:
    """The machine-speed canary of two fingerprints (``canary`` section, written by the profiler), as one
    difference: high impact when the CPU kernel moved more than ``canary.THRESHOLD``, low otherwise."""
    from latencylab.canary import compare_canaries

    d = compare_canaries(a.get("canary"), b.get("canary"))
    if d is None:
        return None
    how = f"{abs(d.slower):.0%} {'slower' if d.slower > 0 else 'faster'}"
    text_b = f"{d.candidate_ns / 1e6:.3f} ms ({how}"
    if d.mem_slower is not None:
        text_b += f"; memory {abs(d.mem_slower):.0%} {'slower' if d.mem_slower > 0 else 'faster'}"
    impact: Impact = "high" if d.moved else "low"
    return EnvDifference("canary.cpu_ns (machine speed)", f"{d.baseline_ns / 1e6:.3f} ms", text_b + ")", impact)


# ------------------------------------------------------------------------------------------ load / render
def load_fingerprint(path: str | Path) -> dict[str, Any]:
    """The fingerprint in a bare `latencylab env --json` file, or in a result file's top-level "env"."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LatencyLabError(f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LatencyLabError(f"cannot read {p}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise LatencyLabError(f"{p} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if isinstance(data, dict) and "fingerprint_version" not in data and isinstance(data.get("env"), dict):
        data = data["env"]
    if not isinstance(data, dict) or "fingerprint_version" not in data:
        raise LatencyLabError(f"{p} holds no environment fingerprint (no 'fingerprint_version' or 'env' key)")
    return data


def _fmt(value: Any) -> str:
    """A value as rich-safe text (escaped, since versions or names may contain "[")."""
    from rich.markup import escape

    if isinstance(value, list):
        return escape(" ".join(map(str, value)) or "-")
    return "-" if value is None else escape(str(value))


def render_fingerprint(fp: dict[str, Any], console: Console) -> None:
    """A compact summary of a fingerprint, one row per topic."""

    def g(path: str) -> str:
        return _fmt(_get(fp, path))

    def gib(path: str) -> str:
        return f"{b / 2**30:.1f} GiB" if isinstance(b := _get(fp, path), int) else "-"

    libs = ", ".join(f"{k} {_fmt(v)}" for k, v in (_get(fp, "libraries") or {}).items() if v) or "-"
    threads = ", ".join(f"{k}={_fmt(v)}" for k, v in (_get(fp, "threads.env") or {}).items() if v is not None)
    threads = threads or "no thread env vars set"
    if _get(fp, "threads.torch_intra_op") is not None:
        threads += f"; torch {g('threads.torch_intra_op')} intra-op / {g('threads.torch_inter_op')} inter-op"
    freq = NOT_EXPOSED
    if _get(fp, "cpu.frequency"):
        freq = f"{g('cpu.frequency.min_mhz')}-{g('cpu.frequency.max_mhz')} MHz, turbo {g('cpu.frequency.turbo')}"
    gpus = _get(fp, "gpu.torch.devices") or _get(fp, "gpu.nvml.devices") or []
    rows = {
        "cpu": f"{g('cpu.model')}: {g('cpu.logical_cpus')} logical / {g('cpu.physical_cores')} physical, "
        f"SMT {g('cpu.smt')}, affinity {g('cpu.affinity')}",
        "isa": g("cpu.isa"),
        "governor": g("cpu.governor"),
        "frequency": freq,
        "memory": f"{gib('memory.total_bytes')} total, {gib('memory.available_bytes')} available",
        "load": f"{g('load.loadavg_1')} {g('load.loadavg_5')} {g('load.loadavg_15')}, {g('load.cpu_percent')}% busy",
        "os": f"{g('os.distro')}, kernel {g('os.release')} {g('os.machine')}, virtualization {g('os.virtualization')}",
        "python": f"{g('python.implementation')} {g('python.version')} ({g('python.compiler')})",
        "libraries": libs,
        "threads": threads,
        "gpu": ", ".join(_fmt(d.get("name")) for d in gpus) or "none",
    }
    if isinstance(canary := _get(fp, "canary"), dict) and canary.get("cpu_ns"):
        rows["canary"] = (
            f"CPU kernel {canary['cpu_ns'] / 1e6:.3f} ms, memory {_fmt(canary.get('mem_gbps'))} GB/s, "
            f"drift {_fmt(canary.get('drift'))}, steal {_fmt(canary.get('steal_fraction'))}"
        )
    _print_table(console, "environment", ("", ""), [[f"[bold]{k}[/]", v] for k, v in rows.items()])


def _print_table(console: Console, title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def render_warnings(warnings: list[EnvWarning], console: Console) -> None:
    """One row per warning: code, what is wrong, what to do."""
    if not warnings:
        console.print("no environment warnings")
        return
    rows = [[f"[yellow]{_fmt(w.code)}[/]", _fmt(w.message), _fmt(w.hint)] for w in warnings]
    _print_table(console, "environment warnings", ("code", "problem", "hint"), rows)


def render_diff(diffs: list[EnvDifference], console: Console) -> None:
    """One row per latency-relevant difference, high impact first."""
    if not diffs:
        console.print("no differences that affect latency")
        return
    colour = {"high": "red", "medium": "yellow", "low": "dim"}
    rows = [[_fmt(d.path), _fmt(d.a), _fmt(d.b), f"[{colour.get(d.impact, 'white')}]{d.impact}[/]"] for d in diffs]
    _print_table(console, "environment differences", ("field", "a", "b", "impact"), rows)

"""Microbenchmarks for this machine's practical roofs: GEMM throughput per dtype and memory bandwidth.

* **Compute** (per dtype, per thread count): square GEMMs ``n x n x n`` (2 n^3 FLOPs), through the paths
  the models use: FP32 and BF16 ``torch.nn.functional.linear`` (``x @ W^T``, nn.Linear's layout) and
  ``torch.matmul`` (row-major ``A @ B``: on CPUs without native BF16 the two hit different kernels, 10x
  apart); INT8 ``torch.ops.quantized.linear`` (u8 x s8 -> s32 with requantisation: the fbgemm/oneDNN kernel
  dynamic quantisation calls), ``torch._int_mm`` (s8 x s8 -> s32) and ONNX Runtime's ``MatMulInteger`` (u8 x
  s8 -> s32, MLAS; where onnxruntime is installed). ``n`` grows 256, 512, ... until one call takes
  ``target_s`` (compute-bound, out of the caches' reach), then best-of-``repeats``. A dtype's peak is its
  best method; a method that raises is recorded as unsupported with the reason.
* **Bandwidth**: ``y.copy_(x)`` (2 x bytes per element: read x + write y) and the STREAM triad
  ``a = b + 3 c`` (``torch.add(b, c, alpha=3, out=a)``: 3 x bytes) over arrays several times the last-level
  cache; write-allocate traffic (the read of ``y``'s line before it is written) is not counted, as in STREAM.
  The bandwidth is the best of the two.

Results are cached per machine (:func:`machine_key`: CPU model, vendor, family, flags, core count, torch
version) as JSON under ``$LATENCYLAB_CACHE/roofline``; :func:`load_or_measure` re-measures with
``refresh=True`` or when the cache is unreadable.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import require
from latencylab.threads import TorchThreads

PEAKS_VERSION = 2  # bump when the methods or sizes change: older cache records are re-measured


@dataclass(frozen=True, slots=True)
class ComputePeak:
    """Best GFLOP/s (GOP/s for INT8) one method reached; ``gflops`` None = unsupported (``note`` says why)."""

    dtype: str
    threads: int
    method: str
    gflops: float | None
    n: int | None = None  # GEMM side of the best measurement
    note: str = ""


@dataclass(frozen=True, slots=True)
class BandwidthPeak:
    threads: int
    method: str  # "copy" | "triad"
    gbs: float  # bytes read + written (no write-allocate) per second / 1e9
    mib: int  # size of one array


@dataclass(frozen=True, slots=True)
class Peaks:
    """The measured roofs of one machine."""

    key: str
    machine: dict[str, Any]
    compute: tuple[ComputePeak, ...]
    bandwidth: tuple[BandwidthPeak, ...]
    clock_ghz: float | None  # measured core clock (cpuclock), None where it cannot be measured
    created_at: str
    wall_s: float
    quick: bool = False
    version: int = PEAKS_VERSION

    @property
    def threads(self) -> tuple[int, ...]:
        return tuple(sorted({c.threads for c in self.compute} | {b.threads for b in self.bandwidth}))

    def _nearest(self, threads: int) -> int:
        below = [t for t in self.threads if t <= threads]
        return max(below) if below else min(self.threads)

    def compute_gflops(self, dtype: str, threads: int) -> float | None:
        """Best measured rate for ``dtype`` at ``threads``; an unmeasured thread count is scaled linearly from
        the nearest measured count below it (ideal scaling: a roof may be optimistic, never pessimistic)."""
        t = self._nearest(threads)
        rates = [c.gflops for c in self.compute if c.dtype == dtype and c.threads == t and c.gflops]
        return max(rates) * (threads / t if threads > t else 1.0) if rates else None

    def best_method(self, dtype: str, threads: int) -> ComputePeak | None:
        t = self._nearest(threads)
        found = [c for c in self.compute if c.dtype == dtype and c.threads == t and c.gflops]
        return max(found, key=lambda c: c.gflops or 0.0) if found else None

    def bandwidth_gbs(self, threads: int) -> float | None:
        t = self._nearest(threads)
        rates = [b.gbs for b in self.bandwidth if b.threads == t]
        return max(rates) if rates else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "roofline-peaks",
            "version": self.version,
            "key": self.key,
            "machine": self.machine,
            "compute": [asdict(c) for c in self.compute],
            "bandwidth": [asdict(b) for b in self.bandwidth],
            "clock_ghz": self.clock_ghz,
            "created_at": self.created_at,
            "wall_s": self.wall_s,
            "quick": self.quick,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Peaks:
        return cls(
            key=str(d["key"]),
            machine=dict(d["machine"]),
            compute=tuple(ComputePeak(**c) for c in d["compute"]),
            bandwidth=tuple(BandwidthPeak(**b) for b in d["bandwidth"]),
            clock_ghz=d.get("clock_ghz"),
            created_at=str(d["created_at"]),
            wall_s=float(d["wall_s"]),
            quick=bool(d.get("quick", False)),
            version=int(d.get("version", 0)),
        )


# ------------------------------------------------------------------------------------------ machine key


def machine_identity() -> dict[str, Any]:
    """What decides the peaks: the CPU (model, vendor, family, flags), the cores we may use, torch."""
    from latencylab.roofline.theory import read_cpu

    cpu = read_cpu()
    torch = _torch()
    return {
        "model_name": cpu.model_name,
        "vendor": cpu.vendor,
        "family": cpu.family,
        "model": cpu.model,
        "flags": sorted(cpu.flags),
        "cores": cpu.cores,
        "logical_cpus": os.cpu_count(),
        "torch": str(torch.__version__),
        "quantized_engine": str(torch.backends.quantized.engine),
    }


def machine_key(identity: dict[str, Any]) -> str:
    blob = json.dumps({"v": PEAKS_VERSION, **identity}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_dir() -> Path:
    """``$LATENCYLAB_CACHE/roofline`` (default ``~/.cache/latencylab/roofline``), the workloads' convention."""
    env = os.environ.get("LATENCYLAB_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "latencylab"
    return root / "roofline"


def cache_path(key: str, quick: bool = False) -> Path:
    return cache_dir() / f"peaks-{key}{'-quick' if quick else ''}.json"


def load_or_measure(refresh: bool = False, quick: bool = False, threads: Sequence[int] | None = None) -> Peaks:
    """The cached peaks of this machine, or measure (and cache) them: always when ``refresh``.

    ``quick`` uses smaller problems and fewer repetitions (a few seconds; tests), cached separately.
    """
    identity = machine_identity()
    key = machine_key(identity)
    path = cache_path(key, quick)
    if not refresh and path.is_file():
        try:
            cached = Peaks.from_dict(json.loads(path.read_text()))
            covers = threads is None or set(threads) <= set(cached.threads)
            if cached.key == key and cached.version == PEAKS_VERSION and covers:
                return cached
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or foreign: measure again and overwrite
    peaks = measure_peaks(threads=threads, quick=quick, identity=identity)
    save(peaks, path)
    return peaks


def save(peaks: Peaks, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # write then rename: readers never see half a file
    tmp.write_text(json.dumps(peaks.to_dict(), indent=1))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ measurement


def measure_peaks(
    threads: Sequence[int] | None = None, quick: bool = False, identity: dict[str, Any] | None = None
) -> Peaks:
    """Measure every roof at each thread count (default: 1 and all usable cores)."""
    from latencylab.results.base import utc_now
    from latencylab.roofline.cpuclock import measure_clock_ghz

    torch = _torch()
    identity = identity or machine_identity()
    counts = sorted(set(threads) if threads else {1, int(identity["cores"])})
    t0 = time.perf_counter()
    clock = measure_clock_ghz(repeats=20 if quick else 60)
    compute: list[ComputePeak] = []
    bandwidth: list[BandwidthPeak] = []
    target = 0.005 if quick else 0.02
    repeats = 3 if quick else 5
    max_n = 512 if quick else 2048
    mib = 48 if quick else 128
    with TorchThreads(counts[0]) as th:
        for t in counts:
            th.set(t)
            for dtype, method, make in _gemms(torch):
                compute.append(_gemm_peak(dtype, t, method, make, target, repeats, max_n))
            bandwidth.extend(_bandwidth(torch, t, mib, 4 if quick else 10))
    return Peaks(
        key=machine_key(identity),
        machine=identity,
        compute=tuple(compute),
        bandwidth=tuple(bandwidth),
        clock_ghz=clock,
        created_at=utc_now(),
        wall_s=time.perf_counter() - t0,
        quick=quick,
    )


GemmFactory = Callable[[int], Callable[[], Any]]


def _gemms(torch: Any) -> list[tuple[str, str, GemmFactory]]:
    f = torch.nn.functional

    def linear(dtype: Any) -> GemmFactory:
        def make(n: int) -> Callable[[], Any]:
            x, w = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            return lambda: f.linear(x, w)

        return make

    def matmul(dtype: Any) -> GemmFactory:
        def make(n: int) -> Callable[[], Any]:
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            return lambda: torch.matmul(a, b)

        return make

    def qlinear(n: int) -> Callable[[], Any]:
        w = torch.quantize_per_tensor(torch.randn(n, n), 0.05, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(w, None)
        x = torch.quantize_per_tensor(torch.randn(n, n), 0.05, 64, torch.quint8)
        return lambda: torch.ops.quantized.linear(x, packed, 1.0, 0)

    def int_mm(n: int) -> Callable[[], Any]:
        a = torch.randint(-128, 127, (n, n), dtype=torch.int8)
        b = torch.randint(-128, 127, (n, n), dtype=torch.int8)
        return lambda: torch._int_mm(a, b)

    def ort_matmul_integer(n: int) -> Callable[[], Any]:
        import numpy as np

        ort: Any = require("onnxruntime", "onnx")
        onnx: Any = require("onnx", "onnx")
        helper, tp = onnx.helper, onnx.TensorProto
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
            "int8-gemm",
            [helper.make_tensor_value_info("a", tp.UINT8, [n, n]), helper.make_tensor_value_info("b", tp.INT8, [n, n])],
            [helper.make_tensor_value_info("y", tp.INT32, [n, n])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = torch.get_num_threads()
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feed = {"a": rng.integers(0, 255, (n, n), dtype=np.uint8), "b": rng.integers(-128, 127, (n, n), dtype=np.int8)}
        return lambda: sess.run(None, feed)

    return [
        ("fp32", "linear", linear(torch.float32)),
        ("fp32", "matmul", matmul(torch.float32)),
        ("bf16", "linear", linear(torch.bfloat16)),
        ("bf16", "matmul", matmul(torch.bfloat16)),
        ("int8", "quantized.linear", qlinear),
        ("int8", "_int_mm", int_mm),
        ("int8", "ort.MatMulInteger", ort_matmul_integer),
    ]


def _gemm_peak(
    dtype: str, threads: int, method: str, make: GemmFactory, target_s: float, repeats: int, max_n: int
) -> ComputePeak:
    best_rate, best_n, n = 0.0, None, 256
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            while True:
                fn = make(n)
                fn()  # warm-up: packing, first-touch, kernel selection
                secs = _best_of(fn, repeats)
                rate = 2.0 * n**3 / secs / 1e9
                if rate > best_rate:
                    best_rate, best_n = rate, n
                if secs >= target_s or n >= max_n:
                    break
                n *= 2
    except Exception as exc:  # an op missing on this build/CPU raises anything from RuntimeError to NotImplemented
        msg = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        return ComputePeak(dtype, threads, method, None, None, f"unsupported: {type(exc).__name__}: {msg}")
    return ComputePeak(dtype, threads, method, best_rate, best_n)


def _bandwidth(torch: Any, threads: int, mib: int, repeats: int) -> list[BandwidthPeak]:
    n = mib * 2**20 // 4
    x, y = torch.ones(n), torch.ones(n)
    copy_s = _best_of(lambda: y.copy_(x), repeats, warmup=1)
    z = torch.ones(n)
    triad_s = _best_of(lambda: torch.add(x, y, alpha=3.0, out=z), repeats, warmup=1)
    nbytes = n * 4
    return [
        BandwidthPeak(threads, "copy", 2 * nbytes / copy_s / 1e9, mib),
        BandwidthPeak(threads, "triad", 3 * nbytes / triad_s / 1e9, mib),
    ]


def _best_of(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> float:
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _torch() -> Any:
    return require("torch", "torch")

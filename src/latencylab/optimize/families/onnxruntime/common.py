"""Constants and the lazy imports every part of the ONNX Runtime family shares; hashing and files: content-addressed,
atomically built artifacts under the work directory."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize.types import BuildContext, Feed

BACKEND = "onnxruntime"
NOT_A_TRANSFORMER = "not a transformer"
SUBDIR = "ort"
# The compute layers (the "first and last layers" of the mixed-precision recipe are chosen among these).
COMPUTE_OPS = ("MatMul", "Gemm", "Conv")
# Ops the dynamic quantizer (IntegerOps mode) rewrites when they carry a float weight initializer.
# Gemm is among them: in dynamic mode the quantizer first rewrites Gemm(alpha=beta=1, transA=0) with a constant B
# into MatMul "<name>_MatMul" + Add (see _with_gemm_aliases).
DYNAMIC_OPS = ("MatMul", "Gemm", "Conv", "Gather", "Attention", "EmbedLayerNormalization", "LSTM")
# Static QDQ: only ops with int8 kernels. Quantising Add/Softmax/LayerNorm too only adds Q/DQ pairs and error.
STATIC_OPS = ("MatMul", "Gemm", "Conv")
FALLBACK_KS = (2, 4, 8, 16)
# Per-channel weights already fix most of the error the fallback repairs: a small K is enough there.
PERCHANNEL_FALLBACK_KS = (2, 4)
SENSITIVITY_FEEDS = 8
# Known transformer shapes per adapter; other models' are read from the graph (detect_encoder).
TRANSFORMERS: dict[str, dict[str, Any]] = {"text": {"model_type": "bert", "num_heads": 12, "hidden_size": 384}}
# ONNX Runtime's graph optimisation levels, by the names recipes use (``params.graph_optimization``).
GRAPH_LEVELS = ("disabled", "basic", "extended", "all")


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "onnx") from exc
    return onnxruntime


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise MissingDependencyError("onnx", "onnx") from exc
    return onnx


def session_options(threads: int, graph: str) -> Any:
    """CPU session options as optimize measures and serve serves them: ``threads`` intra-op threads, one
    inter-op, sequential, graph optimisation ``graph`` (one of :data:`GRAPH_LEVELS`), errors-only logging."""
    ort = _ort()
    if graph not in GRAPH_LEVELS:
        raise LatencyLabError(f"unknown graph optimisation level {graph!r}; one of {', '.join(GRAPH_LEVELS)}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[graph]
    so.log_severity_level = 3  # errors only: initializer-removal chatter is not news
    return so


def _file_digest(ctx: BuildContext, path: Path) -> str:
    """sha256 of a file's bytes, memoised in ``ctx.cache`` by (path, size, mtime)."""
    st = path.stat()
    key = f"ort-digest:{path}:{st.st_size}:{st.st_mtime_ns}"
    if key not in ctx.cache:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        ctx.cache[key] = h.hexdigest()
    return str(ctx.cache[key])


def _feeds_digest(feeds: Sequence[Feed]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            a = np.ascontiguousarray(feed[name])
            h.update(f"{name}:{a.dtype}:{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _key(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _workdir(ctx: BuildContext) -> Path:
    d = ctx.workdir / SUBDIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def _atomic_build(dst: Path, make: Callable[[Path], None]) -> Path:
    """Run ``make(tmp)`` and move the result to ``dst``, unless ``dst`` exists already (then reuse it)."""
    if dst.exists():
        return dst
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.stem}-", suffix=dst.suffix)
    os.close(fd)
    try:
        make(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the artifact is an ordinary file
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dst


class _DropOrtChatter(logging.Filter):
    """The quantizer logs 'Please consider to run pre-processing' on the root logger at every call."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("Please consider") or "pre-processing" in msg)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Drop the quantizer's root-logger advice and the calibrators' progress prints (stdout)."""
    flt = _DropOrtChatter()
    root = logging.getLogger()
    root.addFilter(flt)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.removeFilter(flt)

"""What every part of the OpenVINO family shares: the lazy imports, the compile settings, the IR files.

The compile settings are the other families' thread settings in OpenVINO's words: one stream, ``threads``
inference threads, the latency hint, no CPU pinning (ONNX Runtime and torch do not pin either, and on a
shared machine a pinned thread cannot move away from a busy core). ``precision`` is the inference precision
of the ops left in float: ``f32`` (what every FP32 figure here means), ``bf16``, or ``default``, OpenVINO's
own choice, which is BF16 on a CPU with AVX512_BF16 or AMX: what a user of OpenVINO gets without asking.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError

BACKEND = "openvino"
EXTRA = "openvino"
SUBDIR = "ov"
PRECISIONS = ("f32", "bf16", "default")
# The rt_info key of an exported IR that records the inference precision it was measured at (serve reads it).
PRECISION_KEY = "latencylab_inference_precision"


def _ov() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise MissingDependencyError("openvino", EXTRA) from exc
    return openvino


def _nncf() -> Any:
    try:
        with _quiet():
            import nncf
    except ImportError as exc:
        raise MissingDependencyError("nncf", EXTRA) from exc
    nncf.set_log_level(logging.ERROR)
    return nncf


_CORE: list[Any] = []


def core() -> Any:
    """One ``openvino.Core`` per process (it holds the plugins; making one costs a few ms)."""
    if not _CORE:
        _CORE.append(_ov().Core())
    return _CORE[0]


def compile_config(threads: int, precision: str = "f32") -> dict[str, Any]:
    """The CPU plugin's settings for one latency-bound caller (see the module docstring)."""
    if precision not in PRECISIONS:
        raise LatencyLabError(f"unknown OpenVINO inference precision {precision!r}; one of {', '.join(PRECISIONS)}")
    cfg: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_NUM_THREADS": max(1, int(threads)),
        "ENABLE_CPU_PINNING": False,
    }
    if precision != "default":
        cfg["INFERENCE_PRECISION_HINT"] = precision
    return cfg


def compile_model(model: Any, threads: int, precision: str = "f32") -> Any:
    """``model`` (an ``openvino.Model`` or a path) compiled for the CPU with :func:`compile_config`."""
    return core().compile_model(model, "CPU", compile_config(threads, precision))


def save_ir(model: Any, xml: Path, precision: str | None = None) -> Path:
    """Write ``model`` as OpenVINO IR (``xml`` + its ``.bin``) atomically, weights as they are (never
    compressed to FP16: OpenVINO's ``save_model`` does that by default), the precision in its rt_info."""
    ov = _ov()
    xml = Path(xml)
    xml.parent.mkdir(parents=True, exist_ok=True)
    if precision is not None:
        model = model.clone()
        model.set_rt_info(precision, PRECISION_KEY)
    tmp = Path(tempfile.mkdtemp(dir=xml.parent, prefix=f".{xml.stem}-"))
    try:
        ov.save_model(model, str(tmp / "model.xml"), compress_to_fp16=False)
        os.replace(tmp / "model.bin", xml.with_suffix(".bin"))  # the .bin first: an .xml never lacks its weights
        os.replace(tmp / "model.xml", xml)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return xml


def read_precision(model: Any) -> str | None:
    """The inference precision an IR written by :func:`save_ir` records, or None."""
    with contextlib.suppress(Exception):
        if model.has_rt_info(PRECISION_KEY):
            value = str(model.get_rt_info(PRECISION_KEY).astype(str))
            return value if value in PRECISIONS else None
    return None


def cached_ir(dst: Path, make: Callable[[], Any], precision: str | None = None) -> Path:
    """``dst`` (an IR .xml) made by ``make() -> openvino.Model`` unless it exists already (then reused)."""
    if dst.is_file() and dst.with_suffix(".bin").is_file():
        return dst
    return save_ir(make(), dst, precision)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """NNCF's progress bars and bit-width tables go to stdout/stderr; a search prints its own progress."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield

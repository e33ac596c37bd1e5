"""Apache TVM candidates (``--families tvm``; ``pip install 'latencylab[tvm]'``): Relax from the ONNX export.

``candidates(ctx)`` lists, from the same FP32 ONNX export as the ONNX Runtime family:

* ``tvm-relax``: the graph imported into Relax (``relax.frontend.onnx.from_onnx``, symbolic batch and sequence
  dimensions), ``DecomposeOpsForInference``, then ``tvm.compile`` for the host's LLVM target
  (``Target.from_device(tvm.cpu())``: this CPU's ``-mcpu``) with the default pipelines (operator fusion, the
  default schedules; **no tuning**);
* ``tvm-relax-static``: the same, compiled once per distinct static input shape (TVM's strength: every loop
  bound known), at most :data:`MAX_STATIC_SHAPES`, else skipped with the count.

Threads: TVM's runtime thread pool set to ``ctx.threads`` (``runtime.config_threadpool``), as the other
families' intra-op threads. The compiled library is cached under ``ctx.workdir / "tvm"`` (named by a hash of
the recipe, the FP32 file, the target and TVM's version) and is what ``optimize --out`` exports (``model.so``,
loadable by ``tvm.runtime.load_module`` on a machine with the same CPU); ``serve --from`` does not serve it.

Not here yet: MetaSchedule tuning bounded by ``--tune-time`` with its database cached per machine fingerprint
(a later step: the recipe's ``tune_time_s`` is 0, and a non-zero value is refused), fusion depth as a knob.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.families.onnxruntime.common import _file_digest, _key
from latencylab.optimize.types import BuildContext, Candidate, Feed

__all__ = ["BACKEND", "MAX_STATIC_SHAPES", "TvmRunner", "candidate_from_params", "candidates", "host_target"]

BACKEND = "tvm"
EXTRA = "tvm"
MAX_STATIC_SHAPES = 8


def _tvm() -> Any:
    try:
        import tvm
        from tvm import relax  # noqa: F401 (Relax is the part used; an install without it cannot run here)
    except ImportError as exc:
        raise MissingDependencyError("tvm", EXTRA) from exc
    return tvm


def host_target() -> Any:
    """The LLVM target of this CPU (its ``-mcpu``), as TVM detects it."""
    tvm = _tvm()
    return tvm.target.Target.from_device(tvm.cpu())


def set_threads(n: int) -> None:
    """TVM's runtime thread pool: ``n`` workers (affinity mode 0, TVM's default)."""
    _tvm().get_global_func("runtime.config_threadpool")(0, max(1, int(n)))


def _compile(ctx: BuildContext, shape: Mapping[str, tuple[int, ...]] | None) -> tuple[Path, dict[str, Any]]:
    """The ONNX export compiled to a shared library (cached): for ``shape`` (static) or symbolic dims."""
    tvm = _tvm()
    from tvm import relax

    src = ctx.fp32_onnx()
    target = host_target()
    key = _key("tvm", dict(shape or {}), _file_digest(ctx, src), str(target), tvm.__version__)
    dst = ctx.workdir / "tvm" / f"relax-{key}.so"
    stats = {"target": str(target), "library": str(dst)}
    if dst.is_file():
        return dst, stats
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    graph = onnx.load(str(src))
    mod = from_onnx(graph, shape_dict={n: list(s) for n, s in (shape or {}).items()} or None,
                                        keep_params_in_input=False)  # fmt: skip
    mod = relax.transform.DecomposeOpsForInference()(mod)
    ex = tvm.compile(mod, target=target)  # the default Relax and TIR pipelines: fusion, default schedules
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".relax-"))
    try:
        ex.export_library(str(tmp / "lib.so"))
        os.replace(tmp / "lib.so", dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst, stats


class TvmRunner:
    """A Relax virtual machine over the compiled library; with ``static``, one per distinct input shape
    (compiled on first sight: the search's fidelity pass sees every held-out shape before it times)."""

    def __init__(self, ctx: BuildContext, static: bool, shape_policy: str = shapes.AS_GIVEN) -> None:
        self.ctx = ctx
        self.static = static
        self.shape_policy = shapes.normalise(shape_policy)
        self.tokens = shapes.TokenCounter()
        self.input_names = tuple(ctx.adapter.input_names)
        set_threads(ctx.threads)
        self._vms: dict[Any, Any] = {}
        self.stats: dict[str, Any] = {"static_shapes": 0, "tune_time_s": 0.0}
        self._dynamic = None if static else self._vm(None)

    def _vm(self, shape: Mapping[str, tuple[int, ...]] | None) -> Any:
        tvm = _tvm()
        from tvm import relax

        path, stats = _compile(self.ctx, shape)
        self.stats.update(stats)
        self.path = path
        return relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())

    def run(self, feed: Feed) -> np.ndarray:
        tvm = _tvm()
        try:
            inputs = {n: np.ascontiguousarray(feed[n]) for n in self.input_names}
        except KeyError as exc:
            want = list(self.input_names)
            raise LatencyLabError(f"feed has no input {exc.args[0]!r}; the model wants {want}") from exc
        inputs = shapes.apply(inputs, self.shape_policy)
        self.tokens.count(inputs)
        vm = self._dynamic
        if vm is None:
            key = tuple((n, tuple(int(d) for d in a.shape)) for n, a in inputs.items())
            vm = self._vms.get(key)
            if vm is None:
                if len(self._vms) >= MAX_STATIC_SHAPES:
                    raise LatencyLabError(f"more than {MAX_STATIC_SHAPES} distinct input shapes")
                vm = self._vms[key] = self._vm(dict(key))
                self.stats["static_shapes"] = len(self._vms)
        out = vm["main"](*(tvm.runtime.tensor(inputs[n]) for n in self.input_names))
        if not hasattr(out, "numpy"):  # a tuple of outputs: the first is the model's output
            out = out[0]
        return np.asarray(out.numpy(), dtype=np.float32)

    def export_artifact(self, out_dir: Path) -> Path:
        """``out_dir/model.so``: the compiled library (dynamic shapes; for static, the last shape compiled)."""
        dst = Path(out_dir) / "model.so"
        shutil.copyfile(self.path, dst)
        return dst

    def close(self) -> None:
        self._vms.clear()
        self._dynamic = None


def _skip(params: Mapping[str, Any]) -> Callable[[BuildContext], str | None]:
    def why(ctx: BuildContext) -> str | None:
        try:
            _tvm()
        except MissingDependencyError as exc:
            return str(exc)
        if ctx.device != "cpu":
            return f"the host LLVM target only (device is {ctx.device})"
        if float(params.get("tune_time_s") or 0) > 0:
            return "MetaSchedule tuning (tune_time_s > 0) is not implemented yet"
        if params.get("static"):
            policy = shapes.normalise(params.get("shape_policy"))
            seen = {tuple((n, a.shape) for n, a in sorted(shapes.apply(f, policy).items())) for f in ctx.all_feeds()}
            if len(seen) > MAX_STATIC_SHAPES:
                return (
                    f"{len(seen)} distinct input shapes: static shapes compile one library per shape, at most "
                    f"{MAX_STATIC_SHAPES} (give fixed-length inputs, e.g. --param padding=max_length)"
                )
        return None

    return why


def candidate_from_params(name: str, family: str, params: Mapping[str, Any], description: str = "") -> Candidate:
    """A candidate that rebuilds exactly from its (JSON) params: what the recipe file stores."""
    frozen = json.loads(json.dumps(params))

    def build(ctx: BuildContext) -> TvmRunner:
        try:
            return TvmRunner(ctx, bool(frozen.get("static")), str(frozen.get("shape_policy") or shapes.AS_GIVEN))
        except MissingDependencyError:
            raise
        except Exception as exc:  # a graph TVM cannot import or compile: the search says why and goes on
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LatencyLabError(f"{name}: {type(exc).__name__}: {msg}") from exc

    policy = shapes.normalise(frozen.get("shape_policy"))
    return Candidate(name, family, BACKEND, frozen, build, _skip(frozen), description, input_policy=policy)


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The TVM grid (cheap to list: nothing is imported or compiled until built)."""
    base = {"source": "fp32-onnx", "target": "host-llvm", "pipeline": "default", "tune_time_s": 0}
    return [
        candidate_from_params(
            "tvm-relax",
            "compile",
            {**base, "static": False},
            "Relax from the ONNX export, default pipeline, host LLVM target, symbolic shapes, no tuning",
        ),
        candidate_from_params(
            "tvm-relax-static",
            "compile",
            {**base, "static": True},
            "the same compiled per static input shape (a few shapes), no tuning",
        ),
    ]

"""TVM's part of the build: import the ONNX export into Relax and compile it for this CPU, cached.

**Static shapes are fixed before the import.** TVM 0.27's Relax ONNX importer cannot import MiniLM's export with
symbolic dimensions, nor with a ``shape_dict`` alone (``broadcast_to ... ndim`` from a ``ConstantOfShape``: the
export computes shapes at run time). So for a static shape the graph's inputs are first made fixed
(``onnxruntime.tools.onnx_model_utils.make_input_shape_fixed``) and the shape arithmetic is folded away by ONNX
Runtime's basic graph optimisation (constant folding, redundant nodes; the operators stay standard ONNX), and
TVM imports that. The dynamic recipe imports the export as it is.

Then ``DecomposeOpsForInference`` and ``tvm.compile`` for the host's LLVM target (``Target.from_device``: this
CPU's ``-mcpu``) with the default pipeline (operator fusion; no schedules on a CPU: TIR's naive loops), or, with
a tuning database (:mod:`.tvm_tune`), MetaSchedule's ``compile_relax`` steps (:func:`tuned_pipeline`) under
the recipe's PassContext: ``compile_relax`` opens its own ``PassContext(opt_level=3)``, which drops the
recipe's fusion depth, so the tuned library would have been fused at TVM's default whatever the recipe said
(session 28's ``fuse_max_depth`` was recorded, not applied, on the tuned path). The library is cached under
``ctx.workdir / "tvm"``, named by a hash of the recipe, the FP32 file, the shape, the target and TVM's version.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latencylab.errors import MissingDependencyError
from latencylab.optimize.families.onnxruntime.common import _file_digest, _key
from latencylab.optimize.types import BuildContext

EXTRA = "tvm"
Shape = Mapping[str, tuple[int, ...]]


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


def fixed_onnx(src: Path, shape: Shape, dst: Path) -> Path:
    """``src`` with its inputs fixed to ``shape`` and its shape arithmetic folded (module docstring)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src))
    for name, dims in shape.items():
        make_input_shape_fixed(model.graph, name, [int(d) for d in dims])
    fix_output_shapes(model)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".fixed-"))
    try:
        onnx.save(model, str(tmp / "fixed.onnx"))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(tmp / "folded.onnx")
        ort.InferenceSession(str(tmp / "fixed.onnx"), so, providers=["CPUExecutionProvider"])
        os.replace(tmp / "folded.onnx", dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def relax_module(onnx_path: Path, fast_math: bool = False) -> Any:
    """The ONNX file imported into Relax, inference ops decomposed; with ``fast_math``, erf, exp, tanh and softmax
    replaced by TOPI's fast approximations (``FastMathTransform``: polynomial, vectorisable; libm's ``erff`` is a
    scalar call no schedule vectorises, a third of a tuned MiniLM forward here, session 29)."""
    import onnx
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(str(onnx_path)), keep_params_in_input=False)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return relax.transform.FastMathTransform()(mod) if fast_math else mod


def shape_tag(shape: Shape | None) -> str:
    return "dyn" if not shape else "-".join(f"{n}{'x'.join(map(str, d))}" for n, d in sorted(shape.items()))


def source_for(ctx: BuildContext, shape: Shape | None) -> Path:
    """The ONNX file TVM imports: the export as is (dynamic) or fixed to ``shape`` and folded (static)."""
    src = ctx.fp32_onnx()
    if not shape:
        return src
    key = _key("tvm-fixed", dict(shape), _file_digest(ctx, src))
    return fixed_onnx(src, shape, ctx.workdir / "tvm" / f"fixed-{key}.onnx")


def pass_config(fuse_max_depth: int | None) -> dict[str, Any]:
    """The PassContext config of a recipe's knobs: ``relax.FuseOps.max_depth`` (how many operators FuseOps may
    chain into one kernel; 1 = no fusion) when the recipe sets a fusion depth, else TVM's default."""
    return {} if fuse_max_depth is None else {"relax.FuseOps.max_depth": int(fuse_max_depth)}


def fuse_passes(target: Any) -> list[Any]:
    """Library dispatch, ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FoldConstant``, ``FuseOps``, ``FuseTIR``:
    what MetaSchedule's ``compile_relax`` (and its task extraction) run before the database is applied; run
    under a PassContext whose config carries the fusion depth."""
    _tvm()
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline

    return [
        *relax_pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def tuned_pipeline(target: Any, seen: dict[str, Any]) -> Any:
    """``compile_relax``'s Relax pipeline for a CPU target: :func:`fuse_passes`, ``MetaScheduleApplyDatabase``
    (the tuned kernels replace the fused ones the database holds; the rest keep TIR's default loops), the
    dataflow-lowering and finalising passes. Unlike ``compile_relax`` it runs in the caller's PassContext, so
    the recipe's fusion depth applies. ``seen["kernels"]``: the TIR functions after fusion (what was looked up)."""
    tvm = _tvm()
    from tvm import tirx
    from tvm.relax.transform import MetaScheduleApplyDatabase

    @tvm.transform.module_pass(opt_level=3)
    def pipeline(mod: Any, _ctx: Any) -> Any:
        mod = tvm.transform.Sequential(fuse_passes(target))(mod)
        seen["kernels"] = sum(1 for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))
        mod = MetaScheduleApplyDatabase(enable_warning=False)(mod)
        return tvm.transform.Sequential(_lower_passes(target))(mod)

    return pipeline


def _lower_passes(target: Any) -> list[Any]:
    """``compile_relax``'s dataflow-lowering and finalising passes: the target's, or (TVM 0.27's CPU backend
    registers none: ``cpu_generic`` lacks ``dataflow_lower_passes``) the same fallback list it uses."""
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline

    try:
        return [*relax_pipeline.dataflow_lower_passes(target), *relax_pipeline.finalize_passes(target)]
    except (ValueError, AttributeError):
        t = relax.transform
        lower = [t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(), t.CallTIRRewrite()]
        final = [t.StaticPlanBlockMemory(), t.LowerAllocTensor(), t.KillAfterLastUse(), t.LowerRuntimeBuiltin(),
                 t.ComputePrimValue(), t.VMShapeLower(), t.AttachGlobalSymbol()]  # fmt: skip
        return [*lower, *final]


def kernels(mod: Any, target: Any, fuse_max_depth: int | None) -> int:
    """The TIR kernels the default CPU pipeline's fusion leaves (``LegalizeOps``, ``AnnotateTIROpPattern``,
    ``FoldConstant``, ``FuseOps``, ``FuseTIR`` under the recipe's fusion depth): what the depth knob changes."""
    tvm = _tvm()
    from tvm import relax, tirx

    with target, tvm.transform.PassContext(config=pass_config(fuse_max_depth)):
        fused = tvm.transform.Sequential(relax.backend.cpu_generic.legalize_passes(target))(mod)
    return sum(1 for f in fused.functions.values() if isinstance(f, tirx.PrimFunc))


def compile_library(
    ctx: BuildContext,
    shape: Shape | None,
    database_dir: Path | None = None,
    fuse_max_depth: int | None = None,
    fast_math: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """The compiled shared library for ``shape`` (None: symbolic dims), cached; with ``database_dir``, the
    MetaSchedule tuning records there are applied (``compile_relax``); ``fuse_max_depth``: the fusion depth
    (:func:`pass_config`; None: TVM's default)."""
    tvm = _tvm()
    target = host_target()
    onnx_path = source_for(ctx, shape)
    tuned = str(database_dir) if database_dir else ""
    depth = "" if fuse_max_depth is None else f"fuse{int(fuse_max_depth)}"
    depth += "-fastmath" if fast_math else ""
    key = _key("tvm", dict(shape or {}), _file_digest(ctx, onnx_path), str(target), tvm.__version__, tuned, depth)
    dst = ctx.workdir / "tvm" / f"relax-{shape_tag(shape)}-{key}.so"
    stats: dict[str, Any] = {"target": str(target), "library": str(dst), "fuse_max_depth": fuse_max_depth,
                             "fast_math": fast_math}  # fmt: skip
    info = dst.with_suffix(".json")  # what the build counted, beside the cached library
    if dst.is_file():
        if info.is_file():
            stats.update(json.loads(info.read_text()))
        return dst, stats
    mod = relax_module(onnx_path, fast_math)
    if database_dir is not None:
        from tvm.s_tir import meta_schedule as ms

        db = ms.database.JSONDatabase(work_dir=str(database_dir), allow_missing=False)
        seen: dict[str, Any] = {}
        with target, db, tvm.transform.PassContext(opt_level=3, config=pass_config(fuse_max_depth)):
            ex = tvm.relax.build(mod, target=target, relax_pipeline=tuned_pipeline(target, seen))
        stats["kernels"] = int(seen["kernels"])  # what the tuned compile fused and looked up
    else:
        stats["kernels"] = kernels(mod, target, fuse_max_depth)
        with tvm.transform.PassContext(config=pass_config(fuse_max_depth)):
            ex = tvm.compile(mod, target=target)  # the default Relax and TIR pipelines: fusion, default schedules
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".relax-"))
    try:
        ex.export_library(str(tmp / "lib.so"))
        info.write_text(json.dumps({"kernels": stats["kernels"]}))
        os.replace(tmp / "lib.so", dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst, stats

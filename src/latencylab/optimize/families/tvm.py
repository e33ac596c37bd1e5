"""Apache TVM candidates (``--families tvm``; ``pip install 'latencylab[tvm]'``): Relax from the ONNX export.

``candidates(ctx)`` lists, from the same FP32 ONNX export as the ONNX Runtime family (the build itself:
:mod:`.tvm_build`):

* ``tvm-relax``: the graph imported into Relax with symbolic batch and sequence dimensions, compiled for the
  host's LLVM target with the default pipeline (operator fusion, **no tuning**);
* ``tvm-relax-static``: the same compiled once per distinct static input shape (TVM's strength: every loop
  bound known; the inputs fixed and the shape arithmetic folded before the import), at most
  :data:`~.static_shapes.MAX_STATIC_SHAPES` shapes, else skipped with the count;
* ``tvm-relax-static-unfused``: the static recipe with fusion off (``relax.FuseOps.max_depth`` 1), beside it to
  measure what operator fusion gives; ``optimize --tvm-fuse-depth N`` sets the depth of every other recipe
  (recorded as ``fuse_max_depth``; None: TVM's default), and ``stats.kernels`` counts the kernels fusion left;
  ``optimize --tvm-fast-math`` makes every recipe approximate erf, exp, tanh and softmax (Relax's
  ``FastMathTransform``, recorded as ``fast_math``; the search measures the fidelity it costs);
* ``tvm-relax-buckets``: text inputs of many lengths padded to :data:`BUCKETS` length buckets (edges chosen on
  the calibration feeds' lengths, :func:`~.static_shapes.pad_to_bucket`), one static library per bucket;
* ``tvm-relax-tuned``: the static (or bucketed, when the inputs have too many shapes) libraries with
  MetaSchedule tuning within ``--tune-time`` seconds per shape, its database cached per machine fingerprint
  (:mod:`.tvm_tune`: one ``tune_relax`` call stopped at the budget); skipped while ``--tune-time`` is 0 (the
  default). The recipe records the knobs (``tune_time_s``, ``fuse_max_depth``, candidates per task per
  iteration, the search strategy, the cost model) and the stats the spend beside the speed-up.

Threads: TVM's runtime thread pool set to ``ctx.threads`` (``runtime.config_threadpool``), as the other
families' intra-op threads. ``optimize --out`` exports the compiled library (``model.so``, loadable by
``tvm.runtime.load_module`` on a machine with the same CPU); ``serve --from`` does not serve it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.families import feeds, static_shapes
from latencylab.optimize.families.onnxruntime.common import _file_digest
from latencylab.optimize.families.tvm_build import _tvm, compile_library, host_target, set_threads, shape_tag
from latencylab.optimize.types import BuildContext, Candidate, Feed

__all__ = ["BACKEND", "BUCKETS", "TvmRunner", "candidate_from_params", "candidates", "host_target"]

BACKEND = "tvm"
BUCKETS = 4  # length buckets of the bucketed recipe (edges on the calibration lengths)


def _edges(ctx: BuildContext, k: int) -> list[int]:
    """Up to ``k`` bucket edges from the calibration feeds' real lengths (all of them covered)."""
    from latencylab.optimize.buckets import choose_buckets

    lens = static_shapes.lengths(ctx.adapter.calibration())
    return choose_buckets(lens, coverage=1.0, k=k) if lens else []


def _prepare(
    ctx: BuildContext, params: Mapping[str, Any]
) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """What the recipe does to a feed before the model: the shape policy, then the length buckets if any."""
    policy = shapes.normalise(params.get("shape_policy"))
    k = int(params.get("buckets") or 0)
    edges = _edges(ctx, k) if k else []

    def prep(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = shapes.apply(feed, policy)
        return static_shapes.pad_to_bucket(out, edges) if k else out

    return prep


class TvmRunner:
    """A Relax virtual machine over the compiled library; with ``static``, one per distinct input shape after
    the recipe's preparation (shape policy, buckets), compiled on first sight (the search's fidelity pass sees
    every held-out shape before it times), tuned first when the recipe has a ``tune_time_s``."""

    def __init__(self, ctx: BuildContext, params: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self.params = dict(params)
        self.static = bool(params.get("static"))
        self.tune_time_s = float(params.get("tune_time_s") or 0)
        self.shape_policy = shapes.normalise(params.get("shape_policy"))
        self.prepare = _prepare(ctx, params)
        self.tokens = shapes.TokenCounter()
        self.input_names = tuple(ctx.adapter.input_names)
        set_threads(ctx.threads)
        self._vms: static_shapes.PerShape[Any] = static_shapes.PerShape(self._vm_for)
        self.stats: dict[str, Any] = {"static_shapes": 0, "tune_time_s": 0.0}
        if params.get("buckets"):
            self.stats["bucket_edges"] = _edges(ctx, int(params["buckets"]))
        self._dynamic = None if self.static else self._vm(None)

    def _vm_for(self, key: static_shapes.ShapeKey) -> Any:
        vm = self._vm(dict(key))
        self.stats["static_shapes"] = len(self._vms) + 1
        return vm

    def _vm(self, shape: Mapping[str, tuple[int, ...]] | None) -> Any:
        tvm = _tvm()
        from tvm import relax

        raw = self.params.get("fuse_max_depth")
        depth = None if raw is None else int(raw)
        fast = bool(self.params.get("fast_math"))
        db = self._tune(shape, depth, fast) if shape and self.tune_time_s > 0 else None
        path, stats = compile_library(self.ctx, shape, db, depth, fast)
        self.stats.update(stats)
        self.path = path
        return relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())

    def _tune(self, shape: Mapping[str, tuple[int, ...]], depth: int | None, fast: bool) -> Path:
        from latencylab.optimize.families import tvm_build, tvm_tune

        tvm = _tvm()
        src = tvm_build.source_for(self.ctx, shape)
        machine = tvm_tune.machine_key(str(host_target()), tvm.__version__)
        tag = shape_tag(shape) + ("" if depth is None else f"-fuse{depth}")  # the tasks are the depth's kernels
        tag += "-fastmath" if fast else ""
        work = tvm_tune.database_dir(machine, _file_digest(self.ctx, src), tag)
        got = tvm_tune.tune(src, work, self.tune_time_s, self.ctx.threads, depth, fast)
        self.stats["tune_time_s"] = round(float(self.stats["tune_time_s"]) + float(got["tune_time_s"]), 3)
        self.stats["tuning_reused"] = bool(got["tuning_reused"]) and self.stats.get("tuning_reused", True)
        self.stats["trials"] = int(self.stats.get("trials", 0)) + int(got.get("trials", 0))
        self.stats["machine"] = machine
        return work

    def run(self, feed: Feed) -> np.ndarray:
        tvm = _tvm()
        inputs = self.prepare(feeds.pick(feed, self.input_names))
        self.tokens.count(inputs)
        vm = self._dynamic if self._dynamic is not None else self._vms.get(inputs)
        if vm is None:
            raise LatencyLabError(f"more than {static_shapes.MAX_STATIC_SHAPES} distinct input shapes")
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
        if params.get("tune"):
            if float(params.get("tune_time_s") or 0) <= 0:
                return "MetaSchedule tuning is off (--tune-time 0, the default)"
            from latencylab.optimize.families import tvm_tune

            crashed = tvm_tune.known_crash(tvm_tune.machine_key(str(host_target()), _tvm().__version__))
            if crashed:
                return crashed
        if params.get("buckets") and not static_shapes.lengths(ctx.adapter.calibration()):
            return "no attention mask in the inputs: nothing to bucket by length"
        if params.get("static"):
            return static_shapes.too_many(static_shapes.distinct(ctx.all_feeds(), _prepare(ctx, params)), "library")
        return None

    return why


def candidate_from_params(name: str, family: str, params: Mapping[str, Any], description: str = "") -> Candidate:
    """A candidate that rebuilds exactly from its (JSON) params: what the recipe file stores."""
    frozen = json.loads(json.dumps(params))

    def build(ctx: BuildContext) -> TvmRunner:
        try:
            return TvmRunner(ctx, frozen)
        except MissingDependencyError:
            raise
        except Exception as exc:  # a graph TVM cannot import or compile: the search says why and goes on
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LatencyLabError(f"{name}: {type(exc).__name__}: {msg}") from exc

    policy = shapes.normalise(frozen.get("shape_policy"))
    return Candidate(name, family, BACKEND, frozen, build, _skip(frozen), description, input_policy=policy)


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The TVM grid (cheap to list: nothing is imported or compiled until built). The tuned recipe takes the
    search's ``--tune-time`` (``ctx.cache["tune_time_s"]``, 0 = off) and buckets the lengths when the held-out
    inputs have more static shapes than it may compile."""
    from latencylab.optimize.families import tvm_tune

    depth = ctx.cache.get("tvm_fuse_depth")  # --tvm-fuse-depth: every recipe's fusion depth (None: TVM's)
    base = {"source": "fp32-onnx", "target": "host-llvm", "pipeline": "default", "tune_time_s": 0,
            "fuse_max_depth": None if depth is None else int(depth),
            "fast_math": bool(ctx.cache.get("tvm_fast_math"))}  # fmt: skip
    tune_s = float(ctx.cache.get("tune_time_s") or 0)
    tuned = {**base, "static": True, "tune": True, "tune_time_s": tune_s, "pipeline": "metaschedule",
             "trials_per_iter": tvm_tune.PER_ITER, "strategy": tvm_tune.STRATEGY,
             "cost_model": "random"}  # fmt: skip
    if tune_s > 0 and static_shapes.too_many(static_shapes.distinct(ctx.all_feeds(), _prepare(ctx, tuned))):
        tuned["buckets"] = BUCKETS
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
            "the same compiled per static input shape (a few shapes; inputs fixed before the import), no tuning",
        ),
        candidate_from_params(
            "tvm-relax-static-unfused",
            "compile",
            {**base, "static": True, "fuse_max_depth": 1},
            "the static recipe with fusion off (FuseOps depth 1: a kernel per operator): what fusion gives",
        ),
        candidate_from_params(
            "tvm-relax-buckets",
            "compile",
            {**base, "static": True, "buckets": BUCKETS},
            f"static libraries per length bucket ({BUCKETS} edges on the calibration lengths; padded), no tuning",
        ),
        candidate_from_params(
            "tvm-relax-tuned",
            "compile",
            tuned,
            f"static shapes with MetaSchedule tuning, {tune_s:g} s per shape, database cached per machine",
        ),
    ]

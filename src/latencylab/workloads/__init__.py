"""Built-in workloads and the loader for user pipelines.

A workload module exposes ``build(opts: WorkloadOptions) -> Pipeline``. Heavy
imports (torch, transformers, onnxruntime) happen inside ``build`` so that
``import latencylab`` stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """Options shared by every workload; ``params`` carries workload-specific ``key=value`` pairs."""

    batch_size: int = 1
    seed: int = 0
    device: str = "cpu"
    model_path: str | None = None
    inputs_path: str | None = None
    params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise LatencyLabError(f"batch size must be >= 1, got {self.batch_size}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "seed": self.seed,
            "device": self.device,
            "model_path": self.model_path,
            "inputs_path": self.inputs_path,
            "params": dict(self.params),
        }


# name -> module path (imported lazily)
BUILTIN: dict[str, str] = {
    "text": "latencylab.workloads.text",
    "vision": "latencylab.workloads.vision",
    "synthetic": "latencylab.workloads.synthetic",
    "compiled": "latencylab.workloads.compiled",
    "onnx": "latencylab.workloads.onnx_model",
    "gen": "latencylab.workloads.gen",
}


def build_workload(name: str, opts: WorkloadOptions | None = None) -> Pipeline:
    """Build a built-in workload by name."""
    opts = opts or WorkloadOptions()
    if name not in BUILTIN:
        raise LatencyLabError(f"unknown workload {name!r}; choose one of {', '.join(sorted(BUILTIN))}")
    module = importlib.import_module(BUILTIN[name])
    build: Callable[[WorkloadOptions], Pipeline] = module.build
    return build(opts)


def build_source(workload: str | None, model: str | None, pipeline: str | None, opts: WorkloadOptions) -> Pipeline:
    """The pipeline a ``latencylab profile`` source names: a user ``pipeline`` (package.module:factory), an ONNX
    ``model`` (read from ``opts.model_path``), or the built-in ``workload`` (text when None)."""
    if pipeline:
        return load_pipeline_factory(pipeline, opts)
    if model:
        return build_workload("onnx", opts)
    return build_workload(workload or "text", opts)


def source_options(
    *,
    workload: str | None,
    model: str | None,
    inputs: str | None,
    params: Mapping[str, str],
    threads: int | None,
    batch_size: int,
    device: str,
    seed: int,
    warmup: int,
) -> WorkloadOptions:
    """The options ``latencylab profile`` builds its source with: ``params`` plus ``threads`` for an ONNX
    ``model`` (unless given), and the synthetic workload's ``offset`` (the warm-up, so that injected spikes
    land at timed iteration numbers)."""
    p = dict(params)
    if model and threads and "threads" not in p:
        p["threads"] = str(threads)
    if (workload or "text") == "synthetic":
        p.setdefault("offset", str(warmup))
    return WorkloadOptions(
        batch_size=batch_size, seed=seed, device=device, model_path=model, inputs_path=inputs, params=p
    )


def load_pipeline_factory(spec: str, opts: WorkloadOptions | None = None) -> Pipeline:
    """Build a user pipeline from ``package.module:factory``.

    The factory is called with no arguments, or with a WorkloadOptions if it
    accepts one argument, and must return a Pipeline.
    """
    import inspect

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise LatencyLabError(f"pipeline spec {spec!r} must look like package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LatencyLabError(f"cannot import module {module_name!r} from pipeline spec: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise LatencyLabError(f"module {module_name!r} has no callable {attr!r}")
    try:
        n_params = len(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        n_params = 0
    try:
        pipe = factory(opts or WorkloadOptions()) if n_params >= 1 else factory()
    except LatencyLabError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise LatencyLabError(f"pipeline factory {spec} failed: {type(exc).__name__}: {first}") from exc
    if not isinstance(pipe, Pipeline):
        raise LatencyLabError(f"{spec} returned {type(pipe).__name__}, not a latencylab Pipeline")
    pipe.validate()
    # recorded in results, so that `diagnose --deep result.json` re-imports this pipeline, not a namesake
    pipe.metadata.setdefault("factory", spec)
    if n_params >= 1 and opts is not None:
        pipe.metadata.setdefault("factory_options", opts.to_dict())
    return pipe

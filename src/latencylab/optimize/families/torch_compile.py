"""PyTorch compilation candidates: ``torch-compile`` (inductor), CUDA graphs, FlashAttention (SDPA) and
TensorRT (torch-tensorrt); compile time, graphs, graph breaks and recompilations go into ``runner.stats``."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize.families.torch_base import (
    NO_TENSORRT,
    CompiledRunner,
    TorchRunner,
    dynamo_counter,
    example,
    fresh,
    half,
    is_cuda,
    needs_cuda,
    prepare,
)
from latencylab.optimize.types import BuildContext, Candidate

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("torch", "torch") from exc

# ------------------------------------------------------------------ compilation


def _compile_prerequisite(ctx: BuildContext) -> str | None:
    """Why torch.compile cannot work here, found without compiling (that takes tens of seconds: docs/BENCHMARKS.md)."""
    import shutil

    from torch._dynamo import is_dynamo_supported

    if not is_dynamo_supported():
        return "torch.compile (dynamo) is not supported on this Python/platform"
    if is_cuda(ctx):
        if not torch.cuda.is_available():
            return needs_cuda(ctx)
        if importlib.util.find_spec("triton") is None:
            return "torch.compile (inductor) on CUDA needs triton, which is not installed"
        return None
    import os

    cxx = os.environ.get("CXX")
    if not any(shutil.which(c) for c in ([cxx] if cxx else []) + ["g++", "c++", "clang++"]):
        return "torch.compile (inductor) on CPU needs a C++ compiler (g++/clang++) on PATH"
    return None


def _compile_and_warm(model: nn.Module, ctx: BuildContext, **compile_kwargs: Any) -> CompiledRunner:
    """Compile at the first held-out feed's shape; compile time and graph counts go into stats."""
    model = prepare(model, ctx)
    frames0 = dynamo_counter("frames", "total")
    graphs0 = dynamo_counter("stats", "unique_graphs")
    breaks0 = dynamo_counter("graph_break")
    hits0 = dynamo_counter("inductor", "fxgraph_cache_hit")
    compiled = torch.compile(model, **compile_kwargs)
    runner = CompiledRunner(compiled, ctx.adapter.input_names, ctx.device)
    t0 = time.perf_counter()
    try:
        # the first call compiles; TorchRunner.run, not runner.run, so it is not counted as a recompile
        TorchRunner.run(runner, example(ctx))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LatencyLabError(f"torch.compile failed: {type(exc).__name__}: {first}"[:300]) from exc
    runner.stats = {
        "compile_s": round(time.perf_counter() - t0, 3),
        "frames": dynamo_counter("frames", "total") - frames0,
        "graphs": dynamo_counter("stats", "unique_graphs") - graphs0,
        "graph_breaks": dynamo_counter("graph_break") - breaks0,
        "fx_cache_hits": dynamo_counter("inductor", "fxgraph_cache_hit") - hits0,
        "recompiles": 0,
    }
    return runner


def compile_candidate() -> Candidate:
    params = {"backend": "inductor", "mode": "default", "dynamic": False}

    def build(ctx: BuildContext) -> CompiledRunner:
        return _compile_and_warm(fresh(ctx), ctx, backend="inductor", dynamic=False)

    return Candidate(
        name="torch-compile",
        family="compile",
        backend="torch-compile",
        params=params,
        build=build,
        skip_reason=_compile_prerequisite,
        description="torch.compile (inductor) at the feeds' fixed shape; a new shape recompiles (counted)",
    )


def cudagraphs_candidate() -> Candidate:
    def skip(ctx: BuildContext) -> str | None:
        return needs_cuda(ctx) or _compile_prerequisite(ctx)

    def build(ctx: BuildContext) -> CompiledRunner:
        return _compile_and_warm(fresh(ctx), ctx, mode="reduce-overhead", dynamic=False)

    return Candidate(
        name="torch-cudagraphs",
        family="compile",
        backend="torch-compile",
        params={"backend": "inductor", "mode": "reduce-overhead", "dynamic": False},
        build=build,
        skip_reason=skip,
        description="torch.compile mode=reduce-overhead: inductor kernels replayed as one CUDA graph",
    )


def sdpa_flash_candidate() -> Candidate:
    def skip(ctx: BuildContext) -> str | None:
        why = needs_cuda(ctx)
        if why:
            return why
        if not hasattr(ctx.adapter.torch_model(), "encoder"):
            return "FlashAttention applies to the text (transformer) model only"
        return None

    def build(ctx: BuildContext) -> TorchRunner:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        model = fresh(ctx)
        encoder: Any = model.encoder
        if not hasattr(encoder, "set_attn_implementation"):
            raise LatencyLabError("this transformers version cannot switch attn_implementation to sdpa")
        encoder.set_attn_implementation("sdpa")
        # flash kernels take FP16/BF16 only
        model = prepare(half(model, torch.float16), ctx)
        runner = TorchRunner(
            model, ctx.adapter.input_names, ctx.device, torch.float16,
            context=lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        )  # fmt: skip
        try:
            runner.run(example(ctx))
        except RuntimeError as exc:
            raise LatencyLabError(
                "FlashAttention refused this input (torch's flash SDPA kernel takes no attention mask, and "
                f"padded feeds need one): {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"[:300]
            ) from exc
        return runner

    return Candidate(
        name="torch-sdpa-flash",
        family="graph",
        backend="torch",
        params={"attn_implementation": "sdpa", "sdpa_backend": "FLASH_ATTENTION", "dtype": "float16"},
        build=build,
        skip_reason=skip,
        description="FP16 text model with attention forced onto the FlashAttention SDPA kernel",
    )


def tensorrt_candidate() -> Candidate:
    def skip(ctx: BuildContext) -> str | None:
        missing = [r for r in (needs_cuda(ctx), _tensorrt_missing()) if r]
        return "; ".join(missing) or None

    def build(ctx: BuildContext) -> TorchRunner:
        import torch_tensorrt

        model = prepare(fresh(ctx), ctx)
        feed = example(ctx)
        inputs = [torch.from_numpy(feed[n]).to(ctx.device) for n in ctx.adapter.input_names]
        t0 = time.perf_counter()
        trt = torch_tensorrt.compile(
            model, ir="dynamo", inputs=inputs, enabled_precisions={torch.float16, torch.float32}
        )
        stats = {"compile_s": round(time.perf_counter() - t0, 3)}
        return TorchRunner(trt, ctx.adapter.input_names, ctx.device, stats=stats)

    return Candidate(
        name="torch-tensorrt",
        family="compile",
        backend="torch-compile",
        params={"ir": "dynamo", "precisions": ["float16", "float32"]},
        build=build,
        skip_reason=skip,
        description="Torch-TensorRT (dynamo IR), FP16 kernels allowed, at the feeds' fixed shape",
    )


def _tensorrt_missing() -> str | None:
    return None if importlib.util.find_spec("torch_tensorrt") is not None else NO_TENSORRT

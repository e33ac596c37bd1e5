"""PyTorch candidates: precision, dynamic INT8, torch.compile, pruning, fusion, and the CUDA-only recipes.

``candidates(ctx)`` lists, baseline first:

* ``torch-fp32``: eager FP32, the reference every other candidate is compared against;
* ``torch-bf16``: weights and activations in BF16, the encoder's output cast back to FP32 before the
  pooling and normalisation. Skipped on a CPU without native BF16 (AVX-512 BF16 or AMX), where torch
  emulates it and it is slower than FP32, unless forced (``force_bf16=True``: the peer recipe's
  number, shown honestly);
* ``torch-int8-dynamic``: ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear`` (CPU only);
* ``torch-compile``: inductor at the feeds' fixed shape (``dynamic=False``); compile time, graphs,
  graph breaks and recompilations go into ``runner.stats``;
* pruning (magnitude 50% / 70%, blocks 1x4 and 4x4 at 50%): weights zeroed, dense kernels, so no
  speed-up is expected; the measured sparsity goes into ``runner.stats``;
* ``torch-fuse-layernorm-gelu``: :mod:`latencylab.optimize.fused` where the pattern exists;
* CUDA only: FP16, TF32, CUDA graphs (``mode="reduce-overhead"``), FlashAttention (text, SDPA) and
  TensorRT (torch-tensorrt).

The precision and fusion candidates and the family's list are here; the compilation ones are in
:mod:`.torch_compile`, pruning in :mod:`.torch_prune`, the runners and checks they share in :mod:`.torch_base`.

Every candidate that changes the model works on its own deep copy: the adapter's model (shared by
the baseline and, for the text adapter, by every ``torch_model()`` call) is never modified.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.families.torch_base import (
    NO_FUSION_PATTERN,
    TorchRunner,
    cpu_flags,
    cpu_only,
    example,
    fresh,
    half,
    is_cuda,
    isa_summary,
    native_bf16,
    needs_cuda,
    prepare,
)
from latencylab.optimize.families.torch_compile import (
    compile_candidate,
    cudagraphs_candidate,
    sdpa_flash_candidate,
    tensorrt_candidate,
)
from latencylab.optimize.families.torch_prune import prune_candidate
from latencylab.optimize.types import BuildContext, Candidate

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("torch", "torch") from exc

# ------------------------------------------------------------------ precision


def _fp32_build(ctx: BuildContext, policy: str = shapes.AS_GIVEN) -> TorchRunner:
    model = ctx.adapter.torch_model().eval()
    names = ctx.adapter.input_names
    if not is_cuda(ctx):
        return TorchRunner(prepare(model, ctx), names, ctx.device, shape_policy=policy)
    model = fresh(ctx)  # .to(device) moves a module in place: never move the adapter's
    ieee = functools.partial(_fp32_precision, "ieee")
    return TorchRunner(prepare(model, ctx), names, ctx.device, context=ieee, shape_policy=policy)


def fp32_candidate() -> Candidate:
    return Candidate(
        name="torch-fp32",
        family="precision",
        backend="torch",
        params={"dtype": "float32", "mode": "eager"},
        build=_fp32_build,
        description="PyTorch eager FP32: the reference output and the baseline latency",
    )


def fp32_exact_candidate() -> Candidate:
    """Eager FP32 under shape policy ``exact``: the baseline model on the inputs an ``exact`` variant sees,
    which splits an ``exact`` choice's gain into the pipeline change and the equal-work model speedup."""
    return Candidate(
        name="torch-fp32-exact",
        family="shape",
        backend="torch",
        params={"dtype": "float32", "mode": "eager", "shape_policy": shapes.EXACT},
        build=functools.partial(_fp32_build, policy=shapes.EXACT),
        skip_reason=shapes.exact_skip,
        description="PyTorch eager FP32 on each input's real length (right padding trimmed by the attention mask)",
        input_policy=shapes.EXACT,
    )


def bf16_candidate(force: bool = False) -> Candidate:
    """BF16 weights and activations; ``force`` runs it even where BF16 is emulated (to show the cost)."""

    def skip(ctx: BuildContext) -> str | None:
        if is_cuda(ctx):
            if not torch.cuda.is_available():
                return needs_cuda(ctx)
            if not torch.cuda.is_bf16_supported():
                return "this GPU has no native BF16"
            return None
        isa = cpu_flags(ctx)
        if force or native_bf16(isa):
            return None
        return f"this CPU has no native BF16 ({isa_summary(isa)}): BF16 is emulated and slower"

    def build(ctx: BuildContext) -> TorchRunner:
        model = prepare(half(fresh(ctx), torch.bfloat16), ctx)
        stats = {"forced": force and not is_cuda(ctx) and not native_bf16(cpu_flags(ctx))}
        return TorchRunner(model, ctx.adapter.input_names, ctx.device, torch.bfloat16, stats=stats)

    return Candidate(
        name="torch-bf16",
        family="precision",
        backend="torch",
        params={"dtype": "bfloat16", "mode": "cast", "force": force},
        build=build,
        skip_reason=skip,
        description="weights and activations in BF16; encoder output cast to FP32 before pooling/normalising",
    )


def int8_dynamic_candidate(policy: str = shapes.AS_GIVEN) -> Candidate:
    def build(ctx: BuildContext) -> TorchRunner:
        model = fresh(ctx)
        with warnings.catch_warnings():
            # torch.ao.quantization announces its deprecation on every call; it works in 2.13
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
        n = sum(1 for m in q.modules() if type(m).__module__.startswith("torch.ao.nn.quantized.dynamic"))
        stats = {"quantized_linear": n, "engine": torch.backends.quantized.engine}
        return TorchRunner(prepare(q, ctx), ctx.adapter.input_names, ctx.device, stats=stats, shape_policy=policy)

    exact = policy == shapes.EXACT
    params: dict[str, Any] = {
        "dtype": "qint8", "modules": ["Linear"], "weights": "per-tensor", "activations": "dynamic"
    }  # fmt: skip
    if exact:
        params["shape_policy"] = shapes.EXACT

    def skip(ctx: BuildContext) -> str | None:
        return cpu_only(ctx, "dynamic INT8 (torch.ao)") or (shapes.exact_skip(ctx) if exact else None)

    return Candidate(
        name="torch-int8-dynamic-exact" if exact else "torch-int8-dynamic",
        family="shape" if exact else "int8-dynamic",
        backend="torch",
        params=params,
        build=build,
        skip_reason=skip,
        description="torch.ao dynamic INT8 on every nn.Linear (weights INT8, activations quantised per call)"
        + (", on each input's real length" if exact else ""),
        input_policy=policy,
    )


def fp16_cuda_candidate() -> Candidate:
    def build(ctx: BuildContext) -> TorchRunner:
        model = prepare(half(fresh(ctx), torch.float16), ctx)
        return TorchRunner(model, ctx.adapter.input_names, ctx.device, torch.float16)

    return Candidate(
        name="torch-fp16-cuda",
        family="precision",
        backend="torch",
        params={"dtype": "float16"},
        build=build,
        skip_reason=needs_cuda,
        description="weights and activations in FP16 on the GPU; encoder output cast to FP32 before pooling",
    )


@contextlib.contextmanager
def _fp32_precision(mode: str) -> Iterator[None]:
    """FP32 matmuls and convolutions on CUDA in ``mode`` ("tf32" or "ieee") for one call, then restored.

    The FP32 baseline runs "ieee": torch's default lets cuDNN convolutions use TF32, which would hide
    TF32's error inside the reference.
    """
    matmul: Any = torch.backends.cuda.matmul
    conv: Any = getattr(torch.backends.cudnn, "conv", None)  # torch >= 2.9
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        old = (matmul.fp32_precision, conv.fp32_precision)
        matmul.fp32_precision, conv.fp32_precision = mode, mode
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = old
    else:  # torch < 2.9
        old_flags = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_flags


def tf32_cuda_candidate() -> Candidate:
    def build(ctx: BuildContext) -> TorchRunner:
        return TorchRunner(
            prepare(fresh(ctx), ctx),
            ctx.adapter.input_names,
            ctx.device,
            context=functools.partial(_fp32_precision, "tf32"),
        )

    return Candidate(
        name="torch-tf32-cuda",
        family="precision",
        backend="torch",
        params={"dtype": "float32", "matmul": "tf32", "conv": "tf32"},
        build=build,
        skip_reason=needs_cuda,
        description="FP32 model with TF32 tensor-core matmuls and convolutions (Ampere or newer)",
    )


# ------------------------------------------------------------------ fusion


def _example_tensors(ctx: BuildContext) -> list[torch.Tensor]:
    feed = example(ctx)
    return [torch.from_numpy(feed[n]) for n in ctx.adapter.input_names]


def _fusion_sites(ctx: BuildContext) -> int:
    """How many LayerNorm->GELU pairs a forward pass of the adapter's model shows (cached per context)."""
    key = "torch.fusion.layernorm_gelu"
    if key not in ctx.cache:
        from latencylab.optimize.fused import find_layernorm_gelu

        ctx.cache[key] = len(find_layernorm_gelu(ctx.adapter.torch_model().eval(), _example_tensors(ctx)))
    return int(ctx.cache[key])


def fusion_candidate() -> Candidate:
    def skip(ctx: BuildContext) -> str | None:
        return None if _fusion_sites(ctx) else NO_FUSION_PATTERN

    def build(ctx: BuildContext) -> TorchRunner:
        from latencylab.optimize.fused import fuse_layernorm_gelu

        model, n = fuse_layernorm_gelu(fresh(ctx), _example_tensors(ctx), inplace=True)
        if n == 0:
            raise LatencyLabError(NO_FUSION_PATTERN)
        return TorchRunner(prepare(model, ctx), ctx.adapter.input_names, ctx.device, stats={"fused": n})

    return Candidate(
        name="torch-fuse-layernorm-gelu",
        family="fusion",
        backend="torch",
        params={"fuse": ["LayerNorm", "GELU"], "stats_dtype": "float32", "gelu": "erf"},
        build=build,
        skip_reason=skip,
        description="LayerNorm->GELU as one guarded module (float32 statistics, eps floor, exact erf GELU)",
    )


# ------------------------------------------------------------------ the family


def candidates(ctx: BuildContext, *, force_bf16: bool = False) -> list[Candidate]:
    """Every PyTorch candidate, the FP32 baseline first (the search takes the first as reference).

    ``force_bf16`` runs BF16 even on a CPU that emulates it (to report the peer recipe's number).
    """
    del ctx  # every candidate decides what it can do in its skip_reason
    return [
        fp32_candidate(),
        bf16_candidate(force=force_bf16),
        int8_dynamic_candidate(),
        compile_candidate(),
        prune_candidate(0.5),
        prune_candidate(0.7),
        prune_candidate(0.5, (1, 4)),
        prune_candidate(0.5, (4, 4)),
        fusion_candidate(),
        fp32_exact_candidate(),
        int8_dynamic_candidate(shapes.EXACT),
        fp16_cuda_candidate(),
        tf32_cuda_candidate(),
        cudagraphs_candidate(),
        sdpa_flash_candidate(),
        tensorrt_candidate(),
    ]

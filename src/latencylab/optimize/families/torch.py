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

Every candidate that changes the model works on its own deep copy: the adapter's model (shared by
the baseline and, for the text adapter, by every ``torch_model()`` call) is never modified.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.types import BuildContext, Candidate, Feed

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("torch", "torch") from exc

NEEDS_CUDA = "needs a CUDA device"
NO_TENSORRT = "torch-tensorrt not installed"
DENSE_NOTE = "weights zeroed; dense kernels: expect no speed-up"
NO_FUSION_PATTERN = "no LayerNorm->GELU pattern in this model"

ContextFactory = Callable[[], contextlib.AbstractContextManager[Any]]


# ------------------------------------------------------------------ runners


class TorchRunner:
    """Runs a torch module on numpy feeds under ``torch.inference_mode``; returns float32 numpy.

    Floating inputs (pixels) are cast to ``float_dtype`` when one is given (half-precision models);
    integer inputs (token ids, masks) pass through. ``shape_policy`` (:mod:`latencylab.optimize.shapes`) is
    applied to every feed first, exactly as the ONNX Runtime runner does; ``tokens`` counts what ran.
    ``context`` wraps every call (an SDPA backend
    choice, TF32 flags) and is entered per call so that no global setting outlives the call.
    """

    def __init__(
        self,
        model: Any,
        input_names: Sequence[str],
        device: str = "cpu",
        float_dtype: torch.dtype | None = None,
        context: ContextFactory | None = None,
        stats: dict[str, Any] | None = None,
        shape_policy: str = shapes.AS_GIVEN,
    ) -> None:
        self.model = model
        self.shape_policy = shapes.normalise(shape_policy)
        self.tokens = shapes.TokenCounter()
        self.input_names = tuple(input_names)
        self.device = torch.device(device)
        self.float_dtype = float_dtype
        self._context: ContextFactory = context or contextlib.nullcontext
        self.stats: dict[str, Any] = dict(stats or {})

    def _tensors(self, feed: Feed) -> list[torch.Tensor]:
        out = []
        for name in self.input_names:
            if name not in feed:
                raise LatencyLabError(f"feed has no input {name!r} (it has {sorted(feed)})")
            t = torch.from_numpy(np.ascontiguousarray(feed[name]))
            if self.float_dtype is not None and t.is_floating_point():
                t = t.to(self.float_dtype)
            out.append(t if self.device.type == "cpu" else t.to(self.device))
        return out

    def run(self, feed: Feed) -> np.ndarray:
        if self.model is None:
            raise LatencyLabError("runner is closed")
        feed = shapes.apply(feed, self.shape_policy)
        self.tokens.count(feed)
        args = self._tensors(feed)
        with torch.inference_mode(), self._context():
            out = self.model(*args)
        return _to_numpy(out)

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _to_numpy(out: Any) -> np.ndarray:
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise LatencyLabError(f"model returned {type(out).__name__}, expected a tensor")
    # copied to host memory at once: a CUDA-graph replay overwrites its output buffer on the next call
    return np.asarray(out.detach().float().cpu().numpy(), dtype=np.float32)


def _dynamo_counter(group: str, key: str | None = None) -> int:
    from torch._dynamo.utils import counters

    c: dict[str, int] = dict(counters.get(group, {}))
    return int(sum(c.values()) if key is None else c.get(key, 0))


class CompiledRunner(TorchRunner):
    """A ``torch.compile``-d module; counts the frames dynamo compiles after the first call.

    Dynamo's counters are process-wide, so each call reads them before and after: what changes
    during a call of this runner belongs to it (calls are sequential). The read costs well under a
    microsecond, against milliseconds per inference.
    """

    def run(self, feed: Feed) -> np.ndarray:
        before = _dynamo_counter("frames", "total")
        out = super().run(feed)
        compiled = _dynamo_counter("frames", "total") - before
        if compiled:
            self.stats["recompiles"] = int(self.stats.get("recompiles", 0)) + compiled
        return out


# ------------------------------------------------------------------ helpers


def _is_cuda(ctx: BuildContext) -> bool:
    return str(ctx.device).startswith("cuda")


def _needs_cuda(ctx: BuildContext) -> str | None:
    if not _is_cuda(ctx):
        return NEEDS_CUDA
    if not torch.cuda.is_available():
        return f"{NEEDS_CUDA} (device {ctx.device!r} asked for, but torch sees no CUDA device)"
    return None


def _cpu_only(ctx: BuildContext, what: str) -> str | None:
    if _is_cuda(ctx):
        return f"{what} has CPU kernels only"
    return None


def _isa(ctx: BuildContext) -> frozenset[str]:
    """The CPU flags from the fingerprint, or read from /proc/cpuinfo when the context has none."""
    if ctx.isa:
        return frozenset(ctx.isa)
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def _native_bf16(isa: frozenset[str]) -> bool:
    # x86: AVX-512 BF16 or AMX; Arm: the bf16 feature (BFDOT/BFMMLA)
    return bool(isa & {"avx512_bf16", "amx_bf16", "bf16"})


def _isa_summary(isa: frozenset[str]) -> str:
    if not isa:
        return "CPU flags unknown"
    if "avx512f" in isa:
        return "AVX-512 without BF16"
    if "avx2" in isa:
        return "AVX2 only"
    if "asimd" in isa:
        return "Arm NEON without BF16"
    return "no AVX2"


def _fresh(ctx: BuildContext) -> nn.Module:
    """A private copy of the adapter's model, in eval mode."""
    return copy.deepcopy(ctx.adapter.torch_model()).eval()


def _prepare(model: nn.Module, ctx: BuildContext) -> nn.Module:
    if not _is_cuda(ctx):
        torch.set_num_threads(max(1, int(ctx.threads)))
    return model.to(ctx.device)


def _example(ctx: BuildContext) -> Feed:
    feeds = ctx.adapter.heldout()
    if not feeds:
        raise LatencyLabError(f"adapter {ctx.adapter.name!r} has no held-out feeds")
    return feeds[0]


def _encoder_outputs_fp32(model: nn.Module) -> list[Any]:
    """Cast the encoder's floating outputs to float32, so pooling and normalisation run in float32.

    Applies to a model with an ``encoder`` submodule (the text adapter's Embedder); returns the hook
    handles (empty for other models, whose output is cast once at the end).
    """
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, nn.Module):
        return []

    def hook(_mod: nn.Module, _args: Any, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            return out.float()
        if hasattr(out, "keys"):  # transformers' ModelOutput: an ordered dict with attribute access
            for k in list(out.keys()):
                v = out[k]
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    out[k] = v.float()
        return out

    return [encoder.register_forward_hook(hook)]


def _half(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    model = model.to(dtype)
    _encoder_outputs_fp32(model)
    return model


# ------------------------------------------------------------------ precision


def _fp32_build(ctx: BuildContext, policy: str = shapes.AS_GIVEN) -> TorchRunner:
    model = ctx.adapter.torch_model().eval()
    names = ctx.adapter.input_names
    if not _is_cuda(ctx):
        return TorchRunner(_prepare(model, ctx), names, ctx.device, shape_policy=policy)
    model = _fresh(ctx)  # .to(device) moves a module in place: never move the adapter's
    ieee = functools.partial(_fp32_precision, "ieee")
    return TorchRunner(_prepare(model, ctx), names, ctx.device, context=ieee, shape_policy=policy)


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
        if _is_cuda(ctx):
            if not torch.cuda.is_available():
                return _needs_cuda(ctx)
            if not torch.cuda.is_bf16_supported():
                return "this GPU has no native BF16"
            return None
        isa = _isa(ctx)
        if force or _native_bf16(isa):
            return None
        return f"this CPU has no native BF16 ({_isa_summary(isa)}): BF16 is emulated and slower"

    def build(ctx: BuildContext) -> TorchRunner:
        model = _prepare(_half(_fresh(ctx), torch.bfloat16), ctx)
        stats = {"forced": force and not _is_cuda(ctx) and not _native_bf16(_isa(ctx))}
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
        model = _fresh(ctx)
        with warnings.catch_warnings():
            # torch.ao.quantization announces its deprecation on every call; it works in 2.13
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
        n = sum(1 for m in q.modules() if type(m).__module__.startswith("torch.ao.nn.quantized.dynamic"))
        stats = {"quantized_linear": n, "engine": torch.backends.quantized.engine}
        return TorchRunner(_prepare(q, ctx), ctx.adapter.input_names, ctx.device, stats=stats, shape_policy=policy)

    exact = policy == shapes.EXACT
    params: dict[str, Any] = {
        "dtype": "qint8", "modules": ["Linear"], "weights": "per-tensor", "activations": "dynamic"
    }  # fmt: skip
    if exact:
        params["shape_policy"] = shapes.EXACT

    def skip(ctx: BuildContext) -> str | None:
        return _cpu_only(ctx, "dynamic INT8 (torch.ao)") or (shapes.exact_skip(ctx) if exact else None)

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
        model = _prepare(_half(_fresh(ctx), torch.float16), ctx)
        return TorchRunner(model, ctx.adapter.input_names, ctx.device, torch.float16)

    return Candidate(
        name="torch-fp16-cuda",
        family="precision",
        backend="torch",
        params={"dtype": "float16"},
        build=build,
        skip_reason=_needs_cuda,
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
            _prepare(_fresh(ctx), ctx),
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
        skip_reason=_needs_cuda,
        description="FP32 model with TF32 tensor-core matmuls and convolutions (Ampere or newer)",
    )


# ------------------------------------------------------------------ compilation


def _compile_prerequisite(ctx: BuildContext) -> str | None:
    """Why torch.compile cannot work here, found without compiling (that takes 15-25 s)."""
    import shutil

    from torch._dynamo import is_dynamo_supported

    if not is_dynamo_supported():
        return "torch.compile (dynamo) is not supported on this Python/platform"
    if _is_cuda(ctx):
        if not torch.cuda.is_available():
            return _needs_cuda(ctx)
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
    model = _prepare(model, ctx)
    frames0 = _dynamo_counter("frames", "total")
    graphs0 = _dynamo_counter("stats", "unique_graphs")
    breaks0 = _dynamo_counter("graph_break")
    hits0 = _dynamo_counter("inductor", "fxgraph_cache_hit")
    compiled = torch.compile(model, **compile_kwargs)
    runner = CompiledRunner(compiled, ctx.adapter.input_names, ctx.device)
    t0 = time.perf_counter()
    try:
        # the first call compiles; TorchRunner.run, not runner.run, so it is not counted as a recompile
        TorchRunner.run(runner, _example(ctx))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LatencyLabError(f"torch.compile failed: {type(exc).__name__}: {first}"[:300]) from exc
    runner.stats = {
        "compile_s": round(time.perf_counter() - t0, 3),
        "frames": _dynamo_counter("frames", "total") - frames0,
        "graphs": _dynamo_counter("stats", "unique_graphs") - graphs0,
        "graph_breaks": _dynamo_counter("graph_break") - breaks0,
        "fx_cache_hits": _dynamo_counter("inductor", "fxgraph_cache_hit") - hits0,
        "recompiles": 0,
    }
    return runner


def compile_candidate() -> Candidate:
    params = {"backend": "inductor", "mode": "default", "dynamic": False}

    def build(ctx: BuildContext) -> CompiledRunner:
        return _compile_and_warm(_fresh(ctx), ctx, backend="inductor", dynamic=False)

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
        return _needs_cuda(ctx) or _compile_prerequisite(ctx)

    def build(ctx: BuildContext) -> CompiledRunner:
        return _compile_and_warm(_fresh(ctx), ctx, mode="reduce-overhead", dynamic=False)

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
        why = _needs_cuda(ctx)
        if why:
            return why
        if not hasattr(ctx.adapter.torch_model(), "encoder"):
            return "FlashAttention applies to the text (transformer) model only"
        return None

    def build(ctx: BuildContext) -> TorchRunner:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        model = _fresh(ctx)
        encoder: Any = model.encoder
        if not hasattr(encoder, "set_attn_implementation"):
            raise LatencyLabError("this transformers version cannot switch attn_implementation to sdpa")
        encoder.set_attn_implementation("sdpa")
        # flash kernels take FP16/BF16 only
        model = _prepare(_half(model, torch.float16), ctx)
        runner = TorchRunner(
            model, ctx.adapter.input_names, ctx.device, torch.float16,
            context=lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        )  # fmt: skip
        try:
            runner.run(_example(ctx))
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
        missing = [r for r in (_needs_cuda(ctx), _tensorrt_missing()) if r]
        return "; ".join(missing) or None

    def build(ctx: BuildContext) -> TorchRunner:
        import torch_tensorrt

        model = _prepare(_fresh(ctx), ctx)
        feed = _example(ctx)
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


# ------------------------------------------------------------------ pruning


def _prunable(model: nn.Module) -> list[tuple[str, Any]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]


def magnitude_mask(weight: torch.Tensor, amount: float) -> torch.Tensor:
    """Boolean keep-mask zeroing exactly ``round(amount * numel)`` entries of smallest magnitude."""
    k = round(amount * weight.numel())
    keep = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    if k > 0:
        # topk on -|w| picks exactly k indices even when magnitudes tie
        idx = torch.topk(weight.detach().abs().flatten().float(), k, largest=False, sorted=False).indices
        keep[idx] = False
    return keep.view_as(weight)


def block_mask(weight: torch.Tensor, amount: float, block: tuple[int, int]) -> torch.Tensor | None:
    """Keep-mask zeroing the ``round(amount * n_blocks)`` blocks of smallest L1 norm, or None.

    Blocks tile the weight's GEMM view ``(out, in * kernel)``: for a Linear, ``block=(1, 4)`` is one
    output row by four consecutive inputs; for a convolution the kernel taps of one input channel
    sit next to each other. A weight whose GEMM view the block does not tile gets None (left dense).
    """
    br, bc = block
    w2 = weight.detach().reshape(weight.shape[0], -1)
    rows, cols = w2.shape
    if rows % br or cols % bc:
        return None
    norms = w2.abs().float().reshape(rows // br, br, cols // bc, bc).sum(dim=(1, 3))  # (row blocks, col blocks)
    keep_blocks = magnitude_mask(norms, amount)
    keep = keep_blocks.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)
    return keep.reshape(weight.shape)


def prune_model(model: nn.Module, amount: float, block: tuple[int, int] | None = None) -> dict[str, Any]:
    """Zero weights of every Linear/Conv in place (permanent: no reparametrisation left); returns stats."""
    if not 0.0 <= amount < 1.0:
        raise LatencyLabError(f"prune amount must be in [0, 1), got {amount}")
    layers: dict[str, float] = {}
    dense: list[str] = []
    zeros = total = 0
    with torch.no_grad():
        for name, mod in _prunable(model):
            w: torch.Tensor = mod.weight
            keep = magnitude_mask(w, amount) if block is None else block_mask(w, amount, block)
            if keep is None:
                dense.append(name)
                continue
            w.mul_(keep.to(w.dtype))
            z = int(torch.count_nonzero(w == 0))
            layers[name] = round(z / w.numel(), 6)
            zeros += z
            total += w.numel()
    return {
        "sparsity": round(zeros / total, 6) if total else 0.0,
        "pruned_layers": len(layers),
        "dense_layers": dense,
        "layer_sparsity": layers,
    }


def prune_candidate(amount: float, block: tuple[int, int] | None = None) -> Candidate:
    kind = "magnitude" if block is None else f"block{block[0]}x{block[1]}"
    pct = round(amount * 100)

    def build(ctx: BuildContext) -> TorchRunner:
        model = _fresh(ctx)
        stats = prune_model(model, amount, block)
        return TorchRunner(_prepare(model, ctx), ctx.adapter.input_names, ctx.device, stats=stats)

    what = "unstructured magnitude" if block is None else f"{block[0]}x{block[1]} blocks of smallest L1 norm"
    return Candidate(
        name=f"torch-prune-{kind}-{pct}",
        family="prune",
        backend="torch",
        params={
            "method": "magnitude" if block is None else "block",
            "amount": amount,
            "block": None if block is None else list(block),
            "fine_tuned": False,
        },
        build=build,
        description=f"{pct}% of each Linear/Conv weight pruned ({what}), no fine-tuning; {DENSE_NOTE}",
    )


# ------------------------------------------------------------------ fusion


def _example_tensors(ctx: BuildContext) -> list[torch.Tensor]:
    feed = _example(ctx)
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

        model, n = fuse_layernorm_gelu(_fresh(ctx), _example_tensors(ctx), inplace=True)
        if n == 0:
            raise LatencyLabError(NO_FUSION_PATTERN)
        return TorchRunner(_prepare(model, ctx), ctx.adapter.input_names, ctx.device, stats={"fused": n})

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

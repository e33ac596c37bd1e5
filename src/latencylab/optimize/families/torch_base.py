"""What the PyTorch candidates share: the runners (eager, compiled), the device and ISA checks, a fresh
copy of the adapter's model, the example feed. The candidates are in :mod:`.torch` (the family),
:mod:`.torch_compile` and :mod:`.torch_prune`."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.types import BuildContext, Feed

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
        return to_numpy(out)

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def to_numpy(out: Any) -> np.ndarray:
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise LatencyLabError(f"model returned {type(out).__name__}, expected a tensor")
    # copied to host memory at once: a CUDA-graph replay overwrites its output buffer on the next call
    return np.asarray(out.detach().float().cpu().numpy(), dtype=np.float32)


def dynamo_counter(group: str, key: str | None = None) -> int:
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
        before = dynamo_counter("frames", "total")
        out = super().run(feed)
        compiled = dynamo_counter("frames", "total") - before
        if compiled:
            self.stats["recompiles"] = int(self.stats.get("recompiles", 0)) + compiled
        return out


# ------------------------------------------------------------------ helpers


def is_cuda(ctx: BuildContext) -> bool:
    return str(ctx.device).startswith("cuda")


def needs_cuda(ctx: BuildContext) -> str | None:
    if not is_cuda(ctx):
        return NEEDS_CUDA
    if not torch.cuda.is_available():
        return f"{NEEDS_CUDA} (device {ctx.device!r} asked for, but torch sees no CUDA device)"
    return None


def cpu_only(ctx: BuildContext, what: str) -> str | None:
    if is_cuda(ctx):
        return f"{what} has CPU kernels only"
    return None


def cpu_flags(ctx: BuildContext) -> frozenset[str]:
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


def native_bf16(isa: frozenset[str]) -> bool:
    # x86: AVX-512 BF16 or AMX; Arm: the bf16 feature (BFDOT/BFMMLA)
    return bool(isa & {"avx512_bf16", "amx_bf16", "bf16"})


def isa_summary(isa: frozenset[str]) -> str:
    if not isa:
        return "CPU flags unknown"
    if "avx512f" in isa:
        return "AVX-512 without BF16"
    if "avx2" in isa:
        return "AVX2 only"
    if "asimd" in isa:
        return "Arm NEON without BF16"
    return "no AVX2"


def fresh(ctx: BuildContext) -> nn.Module:
    """A private copy of the adapter's model, in eval mode."""
    return copy.deepcopy(ctx.adapter.torch_model()).eval()


def prepare(model: nn.Module, ctx: BuildContext) -> nn.Module:
    if not is_cuda(ctx):
        torch.set_num_threads(max(1, int(ctx.threads)))
    return model.to(ctx.device)


def example(ctx: BuildContext) -> Feed:
    feeds = ctx.adapter.heldout()
    if not feeds:
        raise LatencyLabError(f"adapter {ctx.adapter.name!r} has no held-out feeds")
    return feeds[0]


def encoder_outputs_fp32(model: nn.Module) -> list[Any]:
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


def half(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    model = model.to(dtype)
    encoder_outputs_fp32(model)
    return model

"""LayerNorm + GELU as one numerically guarded module, and a pass that puts it where the pattern exists.

``FusedLayerNormGELU`` computes ``GELU(LayerNorm(x))`` with three guards that the plain half-precision
composition lacks (the seeds warn that such fusions overflow on edge cases):

* statistics in float32 whatever the input dtype: in float16, ``(x - mean) ** 2`` overflows to inf
  once ``|x - mean|`` passes ~256, so a row near 6e4 (float16's range) would normalise to 0 or NaN;
* two-pass variance of the row shifted by its first element (mean first, then the mean of squared
  deviations), clamped at >= 0, plus ``eps`` (validated > 0): a constant row (variance 0) gives
  finite output, never 0/0, and a tiny variance on a large offset (1000 + 1e-3 noise) is not
  rounded away;
* exact erf GELU, in float32, then one cast back to the input dtype.

In eager PyTorch the module runs the same handful of kernels as the composition (one module, not one
kernel): its value is the guard, and a single unit a compiler can fuse. ``fuse_layernorm_gelu`` finds
``LayerNorm -> GELU`` where the LayerNorm's output feeds a GELU module (checked on a real forward
pass when example inputs are given, by adjacency in ``nn.Sequential`` otherwise), replaces the pair,
and, with example inputs, keeps only the replacements that leave the model's output unchanged.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_GELU_APPROX = ("none", "tanh")


class FusedLayerNormGELU(nn.Module):
    """``GELU(LayerNorm(x))`` over the last ``len(normalized_shape)`` dims, computed in float32.

    Parameters mirror :class:`torch.nn.LayerNorm` (``weight``/``bias`` are kept in float32) plus the
    GELU's ``approximate`` ("none" = exact erf, the default; "tanh" only to reproduce a tanh GELU).
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        approximate: str = "none",
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or any(int(d) < 1 for d in shape):
            raise ValueError(f"normalized_shape must be positive dims, got {normalized_shape!r}")
        if not (math.isfinite(eps) and eps > 0):
            # eps is the guard against var == 0 (a constant row): 0 would divide by zero
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        if approximate not in _GELU_APPROX:
            raise ValueError(f"approximate must be one of {_GELU_APPROX}, got {approximate!r}")
        self.normalized_shape = tuple(int(d) for d in shape)
        self.eps = float(eps)
        self.approximate = approximate
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
            if bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    @classmethod
    def from_layernorm(cls, ln: nn.LayerNorm, approximate: str = "none") -> FusedLayerNormGELU:
        """A fused module with ``ln``'s shape, eps and (float32 copies of) its affine parameters."""
        fused = cls(
            ln.normalized_shape,
            eps=ln.eps,
            elementwise_affine=ln.weight is not None,
            bias=ln.bias is not None,
            approximate=approximate,
        )
        with torch.no_grad():
            if ln.weight is not None and fused.weight is not None:
                fused.weight.copy_(ln.weight.detach().float())
            if ln.bias is not None and fused.bias is not None:
                fused.bias.copy_(ln.bias.detach().float())
        return fused.to(ln.weight.device if ln.weight is not None else "cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.normalized_shape), 0))
        if tuple(x.shape[-len(dims) :]) != self.normalized_shape:
            raise ValueError(f"input's trailing dims {tuple(x.shape)} do not match {self.normalized_shape}")
        x32 = x.float()
        # shift by the row's first element before averaging: a row like 1000 + 1e-3 * noise keeps its
        # small deviations (its float32 sum would round them away); the shift is exact for close values
        n = len(self.normalized_shape)
        shift = x32.reshape(*x32.shape[: x32.dim() - n], -1)[..., :1].reshape(*x32.shape[: x32.dim() - n], *([1] * n))
        shifted = x32 - shift
        centred = shifted - shifted.mean(dim=dims, keepdim=True)
        # two-pass variance: E[(x - mean)^2] cannot go negative the way E[x^2] - mean^2 can; the clamp
        # is for -0.0 and any rounding residue
        var = centred.square().mean(dim=dims, keepdim=True).clamp_min(0.0)
        y = centred * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return F.gelu(y, approximate=self.approximate).to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}, "
            f"approximate={self.approximate!r}"
        )


def _is_gelu(m: nn.Module) -> bool:
    # nn.GELU, and activation wrappers such as transformers' GELUActivation (class name check: no import)
    return isinstance(m, nn.GELU) or "gelu" in type(m).__name__.lower()


def _gelu_approx(m: nn.Module) -> str | None:
    """The GELU flavour of ``m`` if the fused module can reproduce it exactly, else None."""
    if isinstance(m, nn.GELU):
        return m.approximate if m.approximate in _GELU_APPROX else None
    name = type(m).__name__
    if name == "GELUActivation":  # transformers: F.gelu (exact) unless use_gelu_python (same function)
        return "none"
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "GELUPytorchTanh"):
        return "tanh"
    return None  # quick/fast/accurate variants are different functions: not fused


def _parent_and_attr(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def find_layernorm_gelu(model: nn.Module, example_inputs: Sequence[Any] | None = None) -> list[tuple[str, str]]:
    """(layernorm name, gelu name) pairs where the LayerNorm's output is the GELU's input.

    With ``example_inputs``, one forward pass under hooks decides (the GELU module received the very
    tensor the LayerNorm returned), so patterns inside hand-written ``forward`` methods are found too.
    Without, only ``nn.Sequential`` adjacency counts. The model is not modified.
    """
    names = {m: n for n, m in model.named_modules()}
    uses: dict[nn.Module, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        uses[m] = uses.get(m, 0) + 1
    # a module registered in two places cannot be swapped for one of them only
    shared = {m for m, k in uses.items() if k > 1}
    if example_inputs is None:
        pairs = []
        for seq in model.modules():
            if not isinstance(seq, nn.Sequential):
                continue
            kids = list(seq.children())
            for a, b in itertools.pairwise(kids):
                if a in shared or b in shared:
                    continue
                if isinstance(a, nn.LayerNorm) and _is_gelu(b) and _gelu_approx(b) is not None:
                    pairs.append((names[a], names[b]))
        return pairs

    ln_outputs: dict[int, tuple[str, torch.Tensor]] = {}  # id -> (name, tensor kept alive so ids stay unique)
    found: list[tuple[str, str]] = []
    module_by_name = {n: m for m, n in names.items()}
    handles = []

    def after_ln(mod: nn.Module, _args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            ln_outputs[id(out)] = (names[mod], out)

    def before_gelu(mod: nn.Module, args: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and id(args[0]) in ln_outputs:
            ln_name, tensor = ln_outputs[id(args[0])]
            pair = (ln_name, names[mod])
            fusible = (
                tensor is args[0] and _gelu_approx(mod) is not None and not ({mod, module_by_name[ln_name]} & shared)
            )
            if fusible and pair not in found:
                found.append(pair)

    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            handles.append(m.register_forward_hook(after_ln))
        elif _is_gelu(m):
            handles.append(m.register_forward_pre_hook(before_gelu))
    try:
        with torch.inference_mode():
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
    return found


def _outputs_match(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_outputs_match(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_outputs_match(a[k], b[k]) for k in a)
    return bool(a == b)


def fuse_layernorm_gelu(
    model: nn.Module, example_inputs: Sequence[Any] | None = None, inplace: bool = False
) -> tuple[nn.Module, int]:
    """Replace each ``LayerNorm -> GELU`` with ``FusedLayerNormGELU -> Identity``; returns (model, n_fused).

    The model is copied unless ``inplace``. With ``example_inputs`` each replacement is verified: if
    the output changes (the LayerNorm's output had another consumer besides the GELU, say a residual),
    that replacement is undone and not counted.
    """
    out = model if inplace else copy.deepcopy(model)
    pairs = find_layernorm_gelu(out, example_inputs)
    if not pairs:
        return out, 0
    reference = None
    if example_inputs is not None:
        with torch.inference_mode():
            reference = out(*example_inputs)
    n = 0
    for ln_name, gelu_name in pairs:
        ln = out.get_submodule(ln_name)
        gelu = out.get_submodule(gelu_name)
        approx = _gelu_approx(gelu)
        if not isinstance(ln, nn.LayerNorm) or approx is None:
            continue
        ln_parent, ln_attr = _parent_and_attr(out, ln_name)
        gelu_parent, gelu_attr = _parent_and_attr(out, gelu_name)
        fused = FusedLayerNormGELU.from_layernorm(ln, approximate=approx)
        setattr(ln_parent, ln_attr, fused)
        setattr(gelu_parent, gelu_attr, nn.Identity())
        if reference is not None and example_inputs is not None:
            with torch.inference_mode():
                ok = _outputs_match(reference, out(*example_inputs))
            if not ok:  # the GELU was not the LayerNorm's only consumer: put both back
                setattr(ln_parent, ln_attr, ln)
                setattr(gelu_parent, gelu_attr, gelu)
                continue
        n += 1
    return out, n

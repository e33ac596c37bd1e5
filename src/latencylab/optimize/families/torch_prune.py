"""PyTorch pruning candidates: magnitude pruning (unstructured, or in blocks) with the weights zeroed in
place; dense kernels, so no speed-up is expected; the measured sparsity goes into ``runner.stats``."""

from __future__ import annotations

from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize.families.torch_base import DENSE_NOTE, TorchRunner, fresh, prepare
from latencylab.optimize.types import BuildContext, Candidate

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("torch", "torch") from exc

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
        model = fresh(ctx)
        stats = prune_model(model, amount, block)
        return TorchRunner(prepare(model, ctx), ctx.adapter.input_names, ctx.device, stats=stats)

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

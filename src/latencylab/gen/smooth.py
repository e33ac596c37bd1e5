"""SmoothQuant-style activation smoothing of a Llama-style causal LM, folded into its weights.

Dynamic INT8 quantises a Linear layer's input with one scale per call: a few input channels that are
100x larger than the rest (activation outliers: in SmolLM2 the MLP's gated product, ``down_proj``'s input)
take the whole 8-bit range and round every other channel to a few levels. SmoothQuant (Xiao et al., 2023)
moves that range into the weights: ``y = x W^T = (x / s) (W * s)^T`` for any per-input-channel ``s > 0``,
``s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha)``, with ``max|x_j|`` measured on calibration text. The
division is folded into the layer that produces ``x``, so the smoothed model is the same function in
float (exact up to rounding) and costs nothing at run time:

* ``down_proj``'s input ``act(gate(h)) * up(h)``: row ``j`` of ``up_proj`` divided by ``s_j``;
* ``q/k/v_proj``'s input ``input_layernorm(h)``: the RMSNorm's weight divided by ``s``;
* ``gate/up_proj``'s input ``post_attention_layernorm(h)``: the same (after the ``up_proj`` row scaling
  above, when both are asked for, so the two folds compose);
* ``lm_head``'s input ``norm(h)`` (``head``): the final RMSNorm's weight divided by ``s``; a head tied to
  the embedding table gets its own copy first (the table keeps its weights).

``o_proj``'s input (the attention's output) is left alone: with grouped-query attention a ``v_proj`` row
feeds several ``o_proj`` columns. :func:`smooth` returns a smoothed copy; the model is left as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.gen.quant import forward_each

TARGETS = ("down", "qkv", "gate_up", "head")  # which Linear inputs are smoothed (module docstring)


def _torch() -> Any:
    import torch

    return torch


def _blocks(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not len(layers):
        raise LatencyLabError("smooth: not a Llama-style causal LM (no model.layers)")
    for b in layers:
        for path in ("mlp.up_proj", "mlp.down_proj", "mlp.gate_proj", "self_attn.q_proj", "input_layernorm"):
            if not _has(b, path):
                raise LatencyLabError(f"smooth: a decoder block without {path}")
    return list(layers)


def _has(module: Any, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def input_absmax(model: Any, seqs: Sequence[Sequence[int]], paths: Sequence[str]) -> list[dict[str, Any]]:
    """Per block, per Linear path (``mlp.down_proj``), the max |input| of each input channel over ``seqs``
    (calibration text): one forward pass per sequence, hooks on the named layers."""
    torch = _torch()
    blocks = _blocks(model)
    out: list[dict[str, Any]] = [{} for _ in blocks]

    def hook(i: int, path: str) -> Any:
        def on_input(module: Any, inputs: tuple[Any, ...]) -> None:
            m = inputs[0].detach().float().abs().reshape(-1, inputs[0].shape[-1]).amax(dim=0)
            out[i][path] = m if path not in out[i] else torch.maximum(out[i][path], m)

        return on_input

    handles = [b.get_submodule(p).register_forward_pre_hook(hook(i, p)) for i, b in enumerate(blocks) for p in paths]
    try:
        with torch.inference_mode():
            n = 0
            for s in seqs:
                if s:
                    model(input_ids=torch.tensor([list(s)], dtype=torch.long), use_cache=False)
                    n += 1
    finally:
        for h in handles:
            h.remove()
    if not n:
        raise LatencyLabError("smooth: no calibration tokens")
    return out


def scales(x_max: Any, weights: Sequence[Any], alpha: float) -> Any:
    """SmoothQuant's per-input-channel ``s = max|x|^alpha / max|W|^(1-alpha)`` over the Linear layers
    ``weights`` that read the same input (their column max taken together), clamped away from 0."""
    torch = _torch()
    w_max = torch.stack([w.detach().float().abs().amax(dim=0) for w in weights]).amax(dim=0)
    s = x_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1.0 - alpha)
    return s.clamp(min=1e-5)


def smooth(model: Any, seqs: Sequence[Sequence[int]], alpha: float = 0.5, targets: Collection[str] = ("down",)) -> Any:
    """A copy of ``model`` with the inputs named in ``targets`` (:data:`TARGETS`) smoothed with strength
    ``alpha`` (0: all the range stays in the activations; 1: all of it moves into the weights), the scales
    calibrated on ``seqs`` and folded into the producing layer (module docstring): the same function in
    float."""
    torch = _torch()
    bad = sorted(set(targets) - set(TARGETS))
    if bad or not targets:
        raise LatencyLabError(f"smooth: targets must be among {', '.join(TARGETS)}, got {sorted(targets)}")
    if not 0.0 <= alpha <= 1.0:
        raise LatencyLabError(f"smooth: alpha must be in [0, 1], got {alpha}")
    paths = {"down": "mlp.down_proj", "qkv": "self_attn.q_proj", "gate_up": "mlp.gate_proj"}
    stats = input_absmax(model, seqs, [paths[t] for t in TARGETS if t in targets and t != "head"])
    head_max = _head_absmax(model, seqs) if "head" in targets else None
    m = copy.deepcopy(model).eval()
    with torch.no_grad():
        for blk, st in zip(_blocks(m), stats, strict=True):
            mlp, att = blk.mlp, blk.self_attn
            if "down" in targets:
                s = scales(st["mlp.down_proj"], [mlp.down_proj.weight], alpha)
                mlp.up_proj.weight.div_(s[:, None])
                if mlp.up_proj.bias is not None:
                    mlp.up_proj.bias.div_(s)
                mlp.down_proj.weight.mul_(s[None, :])
            if "qkv" in targets:
                lins = [att.q_proj, att.k_proj, att.v_proj]
                _fold_norm(blk.input_layernorm, lins, scales(st["self_attn.q_proj"], [x.weight for x in lins], alpha))
            if "gate_up" in targets:
                lins = [mlp.gate_proj, mlp.up_proj]
                _fold_norm(
                    blk.post_attention_layernorm, lins, scales(st["mlp.gate_proj"], [x.weight for x in lins], alpha)
                )
        if head_max is not None:
            head = m.lm_head
            if getattr(m.config, "tie_word_embeddings", False) or head.weight is m.get_input_embeddings().weight:
                m.config.tie_word_embeddings = False
                head.weight = torch.nn.Parameter(head.weight.detach().clone())
            _fold_norm(m.model.norm, [head], scales(head_max, [head.weight], alpha))
    return m


def _head_absmax(model: Any, seqs: Sequence[Sequence[int]]) -> Any:
    torch = _torch()
    seen: list[Any] = []

    def on_input(module: Any, inputs: tuple[Any, ...]) -> None:
        seen.append(inputs[0].detach().float().abs().reshape(-1, inputs[0].shape[-1]).amax(dim=0))

    h = model.lm_head.register_forward_pre_hook(on_input)
    try:
        forward_each(model, seqs)
    finally:
        h.remove()
    if not seen:
        raise LatencyLabError("smooth: no calibration tokens")
    return torch.stack(seen).amax(dim=0)


def _fold_norm(norm: Any, lins: Sequence[Any], s: Any) -> None:
    if getattr(norm, "weight", None) is None:
        raise LatencyLabError("smooth: a norm without a weight to fold the scales into")
    norm.weight.div_(s)
    if getattr(norm, "bias", None) is not None:
        norm.bias.div_(s)
    for lin in lins:
        lin.weight.mul_(s[None, :])

"""INT8 copies of a causal LM's Linear layers, and which of them INT8 hurts most.

:func:`quantize` returns a copy of the model (the model itself is left as it is) with its ``nn.Linear``
layers (attention and MLP projections, the LM head) in INT8 by one of :data:`METHODS`; the embedding
table stays FP32:

* ``dynamic``: PyTorch's dynamic quantisation with its defaults (``quantize_dynamic``: one weight scale per
  tensor, activations quantised per call with one scale per call, INT8 GEMMs);
* ``dynamic-perchannel``: the same with one weight scale per output channel;
* ``weight``: weight-only INT8, per output channel (symmetric, round to nearest), FP32 activations,
  computed by ``torch._weight_int8pack_mm`` (gpt-fast's int8 mode).

``keep`` names Linear layers left in FP32 (the mixed-precision candidates of ``optimize --workload gen``).

:func:`sensitivity` ranks the Linear layers by the harm INT8 does to each alone, the idea the encoder
search's ONNX Runtime fallback uses for its nodes: here, each layer's **local relative output error**,
``||y_int8 - y||^2 / ||y||^2`` summed over calibration sequences, where ``y`` is the layer's FP32 output on
the FP32 model's own activations and ``y_int8`` the quantised layer's on the same input. One forward pass
per sequence (hooks), not one per layer: a 135M-parameter model's 211 layers rank in seconds. It is a
proxy (an error in an early layer is amplified downstream, one in the LM head is not), which is why the
search still measures the fidelity of the mixed copy end to end.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection, Sequence
from typing import Any

from latencylab.errors import LatencyLabError

METHODS = ("dynamic", "dynamic-perchannel", "weight")


def _torch() -> Any:
    import torch

    return torch


def linear_names(model: Any) -> list[str]:
    """The qualified names of the model's ``nn.Linear`` layers, in module order."""
    torch = _torch()
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _qconfig(method: str) -> Any:
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    return per_channel_dynamic_qconfig if method == "dynamic-perchannel" else default_dynamic_qconfig


def _weight_only(lin: Any) -> Any:
    return WeightOnlyInt8Linear(lin)


class WeightOnlyInt8Linear(_torch().nn.Module):  # type: ignore[misc]
    """``y = x W^T + b`` with W stored as INT8 rows and one FP32 scale per row (output channel)."""

    def __init__(self, lin: Any) -> None:
        torch = _torch()
        super().__init__()
        w = lin.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().clone())
        self.in_features, self.out_features = lin.in_features, lin.out_features

    def forward(self, x: Any) -> Any:
        torch = _torch()
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def quantize(model: Any, method: str, keep: Collection[str] = ()) -> Any:
    """An INT8 copy of ``model`` by ``method`` (:data:`METHODS`), the Linear layers named in ``keep`` left FP32."""
    torch = _torch()
    if method not in METHODS:
        raise LatencyLabError(f"int8 method must be one of {', '.join(METHODS)}, got {method!r}")
    names = linear_names(model)
    unknown = sorted(set(keep) - set(names))
    if unknown:
        raise LatencyLabError(f"keep: no Linear layer named {unknown[0]!r} in the model")
    chosen = [n for n in names if n not in set(keep)]
    q = copy.deepcopy(model)
    if getattr(q.config, "tie_word_embeddings", False):  # the LM head gets its own INT8 copy; the embedding
        q.config.tie_word_embeddings = False  # table keeps the FP32 one (and nothing re-ties them)
    if method == "weight":
        wanted = set(chosen)
        for parent_name, parent in list(q.named_modules()):
            for child_name, child in list(parent.named_children()):
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                if full in wanted and isinstance(child, torch.nn.Linear):
                    setattr(parent, child_name, _weight_only(child))
    elif chosen:
        qc = _qconfig(method)
        with warnings.catch_warnings():  # torch.ao's deprecation notice (torchao is not installed here)
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(q, {n: qc for n in chosen}, dtype=torch.qint8)
    return q.eval()


def _int8_layer(lin: Any, method: str) -> Any:
    torch = _torch()
    if method == "weight":
        return _weight_only(lin)
    one = copy.deepcopy(lin)
    one.qconfig = _qconfig(method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.nn.quantized.dynamic.Linear.from_float(one)


def sensitivity(model: Any, seqs: Sequence[Sequence[int]], method: str = "dynamic") -> tuple[tuple[str, float], ...]:
    """(layer name, local relative output error) for every Linear layer, the most harmed first (module
    docstring); ``seqs`` are calibration token sequences, never the held-out ones."""
    torch = _torch()
    if method not in METHODS:
        raise LatencyLabError(f"int8 method must be one of {', '.join(METHODS)}, got {method!r}")
    if not any(len(s) for s in seqs):
        raise LatencyLabError("sensitivity: no calibration tokens")
    modules = dict(model.named_modules())
    names = linear_names(model)
    err = dict.fromkeys(names, 0.0)
    ref = dict.fromkeys(names, 0.0)
    quantised: dict[str, Any] = {}

    def hook(name: str) -> Any:
        def on_output(module: Any, inputs: tuple[Any, ...], out: Any) -> None:
            if name not in quantised:
                quantised[name] = _int8_layer(module, method)
            y = out.detach().float()
            d = quantised[name](inputs[0].detach()).float() - y
            err[name] += float((d * d).sum())
            ref[name] += float((y * y).sum())

        return on_output

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        with torch.inference_mode():
            for s in seqs:
                if s:
                    model(input_ids=torch.tensor([list(s)], dtype=torch.long), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    scores = [(n, err[n] / ref[n] if ref[n] > 0 else 0.0) for n in names]
    return tuple(sorted(scores, key=lambda x: -x[1]))

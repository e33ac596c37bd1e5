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

:func:`screen` is the end-to-end answer: one INT8 copy, each group of Linear layers (:func:`layer_groups`:
a decoder block, one projection kind across the blocks, the LM head) swapped back to FP32 in turn, the
copy's perplexity on calibration text each time; the groups that recover the most are then kept FP32
greedily until the perplexity is within a target of FP32's or a share of the weights is spent. With
``judge`` (validation text: neither the calibration text nor the search's held-out text) the groups are
still ranked on the calibration text, but each greedy addition is judged on the validation text: a group
is kept only if the validation perplexity falls, and the keep stops when the validation perplexity is
within the target (eight calibration lines over-fit a choice judged on themselves: +0.8% there, +10.6%
on held-out text in session 12).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError

METHODS = ("dynamic", "dynamic-perchannel", "weight")


def _torch() -> Any:
    import torch

    return torch


def forward_each(model: Any, seqs: Sequence[Sequence[int]]) -> None:
    """One no-cache forward per non-empty token sequence, for the hooks a caller registered (calibration)."""
    torch = _torch()
    with torch.inference_mode():
        for s in seqs:
            if s:
                model(input_ids=torch.tensor([list(s)], dtype=torch.long), use_cache=False)


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
        forward_each(model, seqs)
    finally:
        for h in handles:
            h.remove()
    scores = [(n, err[n] / ref[n] if ref[n] > 0 else 0.0) for n in names]
    return tuple(sorted(scores, key=lambda x: -x[1]))


# ------------------------------------------------------------------------------------ the end-to-end screen


def layer_groups(model: Any) -> dict[str, list[str]]:
    """Groups of Linear layers the screen tries in FP32: each decoder block (``block.<i>``), each projection
    kind across all blocks (``kind.<name>``, e.g. ``kind.down_proj``) and every layer outside the blocks by
    name (``lm_head``)."""
    import re

    groups: dict[str, list[str]] = {}
    for name in linear_names(model):
        m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
        if m is None:
            groups.setdefault(name, []).append(name)
            continue
        groups.setdefault(f"block.{int(m.group(1))}", []).append(name)
        groups.setdefault(f"kind.{name.rsplit('.', 1)[-1]}", []).append(name)
    return groups


@dataclass(frozen=True, slots=True)
class Screen:
    """The INT8 copy's perplexity on calibration text with each group of Linear layers in FP32, alone
    (``groups``: name, layers, share of the Linear weights, perplexity; the most helpful first), and the
    greedy keep (``kept``: groups added in that order until the perplexity is within ``target`` of FP32's
    or the kept share would pass ``max_share``; ``curve``: the perplexity after each addition)."""

    method: str
    fp32_ppl: float
    int8_ppl: float
    groups: tuple[tuple[str, int, float, float], ...]
    kept: tuple[str, ...]
    kept_layers: tuple[str, ...]
    kept_share: float
    curve: tuple[tuple[str, float, float], ...]  # group added, perplexity after, kept share after
    target: float
    max_share: float
    judged_on: str = "calibration"  # or "validation": the text the greedy keep is judged on
    judge_fp32_ppl: float = 0.0  # FP32's perplexity of the judged text (fp32_ppl when calibration)
    judge_int8_ppl: float = 0.0
    rejected: tuple[str, ...] = ()  # groups tried and not kept: the judged perplexity did not fall

    @property
    def met(self) -> bool:
        ppl = self.curve[-1][1] if self.curve else (self.judge_int8_ppl or self.int8_ppl)
        return ppl / (self.judge_fp32_ppl or self.fp32_ppl) - 1.0 <= self.target

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method, "fp32_ppl": self.fp32_ppl, "int8_ppl": self.int8_ppl, "met": self.met,
            "groups": [list(g) for g in self.groups], "kept": list(self.kept), "kept_share": self.kept_share,
            "kept_layers": len(self.kept_layers), "curve": [list(c) for c in self.curve], "target": self.target,
            "max_share": self.max_share, "judged_on": self.judged_on, "judge_fp32_ppl": self.judge_fp32_ppl,
            "judge_int8_ppl": self.judge_int8_ppl, "rejected": list(self.rejected),
        }  # fmt: skip


class _Swapper:
    """Puts FP32 Linear layers (the original model's, shared read-only) into an INT8 copy and takes them out."""

    def __init__(self, fp32: Any, q: Any) -> None:
        self.fp32, self.q = fp32, q
        self.int8 = {n: q.get_submodule(n) for n in linear_names(fp32)}

    def _set(self, name: str, module: Any) -> None:
        parent, _, child = name.rpartition(".")
        setattr(self.q.get_submodule(parent) if parent else self.q, child, module)

    def use_fp32(self, names: Collection[str]) -> None:
        for n in names:
            self._set(n, self.fp32.get_submodule(n))

    def use_int8(self, names: Collection[str]) -> None:
        for n in names:
            self._set(n, self.int8[n])


def screen(
    model: Any, seqs: Sequence[Sequence[int]], method: str = "dynamic", target: float = 0.02, max_share: float = 0.5,
    judge: Sequence[Sequence[int]] | None = None,
) -> Screen:  # fmt: skip
    """Which Linear layers cause INT8's perplexity damage, measured end to end (:class:`Screen`): one INT8
    copy, each :func:`layer_groups` group swapped back to FP32 in turn, the perplexity of ``seqs``
    (calibration text, never the held-out text the search scores) each time; then the greedy keep, judged
    on ``judge`` (validation text) when given, else on ``seqs`` (module docstring)."""
    from latencylab.workloads.gen_fidelity import perplexity

    if not any(len(s) > 1 for s in seqs):
        raise LatencyLabError("screen: no calibration sequence of 2 tokens or more")
    if judge is not None and not any(len(s) > 1 for s in judge):
        raise LatencyLabError("screen: no validation sequence of 2 tokens or more")
    params = {n: int(model.get_submodule(n).weight.numel()) for n in linear_names(model)}
    total = sum(params.values())
    groups = layer_groups(model)
    base = perplexity(model, seqs)
    q = quantize(model, method)
    sw = _Swapper(model, q)
    full = perplexity(q, seqs)
    rows = []
    for g, names in groups.items():
        sw.use_fp32(names)
        rows.append((g, len(names), sum(params[n] for n in names) / total, perplexity(q, seqs)))
        sw.use_int8(names)
    rows.sort(key=lambda r: r[3])
    jtext = seqs if judge is None else judge
    jbase = base if judge is None else perplexity(model, jtext)
    jfull = full if judge is None else perplexity(q, jtext)
    kept: list[str] = []
    rejected: list[str] = []
    layers: set[str] = set()
    curve: list[tuple[str, float, float]] = []
    ppl = jfull
    for g, _, _, _ in rows:
        if ppl / jbase - 1.0 <= target:
            break
        more = layers | set(groups[g])
        share = sum(params[n] for n in more) / total
        if more == layers or share > max_share:
            continue
        sw.use_fp32(more - layers)
        after = perplexity(q, jtext)
        if judge is not None and after >= ppl:  # no gain on the validation text: put it back in INT8
            sw.use_int8(more - layers)
            rejected.append(g)
            continue
        layers, ppl = more, after
        kept.append(g)
        curve.append((g, ppl, share))
    order = tuple(n for n in linear_names(model) if n in layers)
    share = sum(params[n] for n in layers) / total
    return Screen(
        method, base, full, tuple(rows), tuple(kept), order, share, tuple(curve), target, max_share,
        "calibration" if judge is None else "validation", jbase, jfull, tuple(rejected),
    )  # fmt: skip

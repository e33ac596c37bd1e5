"""A Llama-family causal LM as one ONNX graph with its K/V cache as inputs and outputs, for ONNX Runtime.

Why: on a CPU the eager decode step of a 135M model spends more time in Python and small ops (norms, RoPE,
attention, dispatch) than in its weight reads; one ORT graph runs the whole step in C++
(docs/benchmarks/optimize-gen.md, "Session 25: the model as one ONNX Runtime graph"). ``LlamaStep``
re-expresses the HF model's forward with plain tensor ops on its own weights (no HF cache classes, which do not
export), so the graph is

    (input_ids [1, S], past_k [L, 1, Hkv, T, D], past_v [L, 1, Hkv, T, D])
        -> (logits [1, S or 1, V], present_k [L, 1, Hkv, T + S, D], present_v [...])

with causal attention over the past and the new tokens, positions T .. T + S - 1 (one sequence: the batch
dimension is fixed at 1, so every reshape has a constant shape and the graph no shape arithmetic per layer).
``last_only`` keeps the LM head to the last position (generation); without it every position's logits come
back (perplexity, forced agreement). Linear weights are ``MatMul`` initializers
[K, N], so :func:`quantize_matmuls` can swap them for ORT's blockwise ``MatMulNBits``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["check_llama", "export_llama", "quantize_matmuls"]


def check_llama(model: Any) -> None:
    """Refuse (one line) a model ``LlamaStep`` does not reproduce."""
    cfg = model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise LatencyLabError(f"ONNX Runtime decode supports Llama-family models, not {cfg.model_type!r}")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise LatencyLabError(f"ONNX Runtime decode: rope type {rope.get('rope_type')!r} not supported")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise LatencyLabError("ONNX Runtime decode: biased attention/MLP projections not supported")


def _step_module(model: Any, last_only: bool) -> Any:
    import torch
    from torch import nn

    cfg = model.config
    check_llama(model)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    nh, nkv, eps = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), float(cfg.rms_norm_eps)
    grp, inter = nh // nkv, int(cfg.intermediate_size)

    def t(w: Any) -> Any:  # a Linear's weight [N, K] as a MatMul initializer [K, N]
        return nn.Parameter(w.detach().t().contiguous(), requires_grad=False)

    class LlamaStep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inner = model.model
            self.embed = nn.Parameter(inner.embed_tokens.weight.detach().clone(), requires_grad=False)
            self.head = t(model.lm_head.weight)
            self.norm = nn.Parameter(inner.norm.weight.detach().clone(), requires_grad=False)
            layers = []
            for ly in inner.layers:
                a, m = ly.self_attn, ly.mlp
                # q, k, v in one MatMul and gate, up in another: fewer, larger weight reads a step
                p = nn.ParameterDict({
                    "ln1": nn.Parameter(ly.input_layernorm.weight.detach().clone(), requires_grad=False),
                    "ln2": nn.Parameter(ly.post_attention_layernorm.weight.detach().clone(), requires_grad=False),
                    "qkv": t(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                    "o": t(a.o_proj.weight), "gateup": t(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                    "down": t(m.down_proj.weight),
                })  # fmt: skip
                layers.append(p)
            self.layers = nn.ModuleList(layers)
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv, persistent=False)
            half = hd // 2
            rot = torch.zeros(hd, hd)  # x @ rot == rotate_half(x) == cat(-x[half:], x[:half])
            rot[torch.arange(half) + half, torch.arange(half)] = -1.0
            rot[torch.arange(half), torch.arange(half) + half] = 1.0
            self.register_buffer("rot", rot, persistent=False)

        @staticmethod
        def rms(x: Any, w: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

        def forward(self, input_ids: Any, past_k: Any, past_v: Any) -> Any:
            # batch 1, and reshapes to constant shapes (one -1): no Shape/Gather/Concat chains per layer
            me: Any = self  # parameters and buffers by name (typed as Module | Tensor)
            s = input_ids.shape[1]
            past = past_k.shape[3]
            pos = torch.arange(s, dtype=torch.float32) + past
            freqs = pos[:, None] * me.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, s, d]
            qi = torch.arange(s)[:, None] + past
            kj = torch.arange(past + s)[None, :]
            # causal over the past and the new positions, repeated for the query heads sharing a K/V head
            mask = torch.where(kj <= qi, 0.0, float("-inf")).repeat(grp, 1)  # [group * s, total]
            x = me.embed[input_ids]
            ks, vs = [], []
            for i, p in enumerate(me.layers):
                h = self.rms(x, p["ln1"])
                heads = (h @ p["qkv"]).reshape(1, -1, nh + 2 * nkv, hd).transpose(1, 2)  # [1, heads, s, d]
                qk = heads[:, : nh + nkv]
                # RoPE on q and k at once; rotate_half as a MatMul by a signed permutation (exact)
                qk = qk * cos + (qk @ me.rot) * sin
                k = torch.cat([past_k[i], qk[:, nh:]], dim=2)
                v = torch.cat([past_v[i], heads[:, nh + nkv :]], dim=2)
                ks.append(k)
                vs.append(v)
                # grouped-query attention without copying K/V per head: [1, kv, group * s, d]
                qg = qk[:, :nh].reshape(1, nkv, -1, hd)
                att = torch.softmax((qg @ k.transpose(-1, -2)) * (hd**-0.5) + mask, -1)
                o = (att @ v).reshape(1, nh, -1, hd).transpose(1, 2).reshape(1, -1, nh * hd)
                x = x + o @ p["o"]
                h = self.rms(x, p["ln2"])
                gu = h @ p["gateup"]
                x = x + (torch.nn.functional.silu(gu[..., :inter]) * gu[..., inter:]) @ p["down"]
            x = self.rms(x, me.norm)
            if last_only:
                x = x[:, -1:]
            return x @ me.head, torch.stack(ks), torch.stack(vs)

    return LlamaStep().eval()


def export_llama(model: Any, path: Path, last_only: bool = True, opset: int = 17) -> Path:
    """Write ``model`` (an HF LlamaForCausalLM) as the graph of the module docstring to ``path``."""
    import torch

    mod = _step_module(model, last_only)
    cfg = model.config
    hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    shape = (int(cfg.num_hidden_layers), 1, int(cfg.num_key_value_heads), 3, hd)
    args = (torch.tensor([[1, 2]]), torch.zeros(shape), torch.zeros(shape))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        torch.onnx.export(
            mod, args, str(path), input_names=["input_ids", "past_k", "past_v"],
            output_names=["logits", "present_k", "present_v"],
            dynamic_axes={
                "input_ids": {1: "seq"}, "past_k": {3: "past"}, "past_v": {3: "past"}, "logits": {1: "out"},
                "present_k": {3: "total"}, "present_v": {3: "total"},
            },
            opset_version=opset, dynamo=False,
        )  # fmt: skip
    return path


def quantize_matmuls(
    src: Path, dst: Path, bits: int = 8, block: int = 32, accuracy_level: int = 4, keep_float: Sequence[str] = ()
) -> int:
    """Replace every ``MatMul`` whose second input is a 2-D float initializer [K, N] by ORT's ``MatMulNBits``:
    ``bits``-bit weights, asymmetric, one scale and zero point per ``block`` consecutive K values of each output
    column; ``accuracy_level`` 4 computes with the activations quantised to INT8 per block too (ORT's fast
    path). ``keep_float``: weight kinds left FP32 (``qkv``, ``o``, ``gateup``, ``down``, ``head``: the names
    ``LlamaStep`` gives its weights). Returns how many were replaced."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    if bits not in (4, 8):
        raise LatencyLabError(f"MatMulNBits takes 4 or 8 bits, not {bits}")
    m = onnx.load(str(src))
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    used: dict[str, int] = {}
    for n in g.node:
        for name in n.input:
            used[name] = used.get(name, 0) + 1
    new_nodes, drop, n_q = [], set(), 0
    lv = (1 << bits) - 1
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        arr = numpy_helper.to_array(w) if w is not None else None
        kind = n.input[1].rsplit(".", 1)[-1] if w is not None else ""
        if arr is None or arr.ndim != 2 or arr.dtype != np.float32 or arr.shape[0] % block or kind in keep_float:
            new_nodes.append(n)
            continue
        k, nn_ = arr.shape
        nb = k // block
        wt = arr.T.reshape(nn_, nb, block)
        mn, mx = np.minimum(wt.min(-1), 0.0), np.maximum(wt.max(-1), 0.0)
        sc = ((mx - mn) / lv).astype(np.float32)
        sc[sc == 0] = 1.0
        zp = np.clip(np.round(-mn / sc), 0, lv).astype(np.uint8)
        q = np.clip(np.round(wt / sc[..., None]) + zp[..., None], 0, lv).astype(np.uint8)
        if bits == 4:
            q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
            zp = np.pad(zp, ((0, 0), (0, nb % 2)))
            zp = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
        base = n.input[1]
        g.initializer.extend([
            numpy_helper.from_array(np.ascontiguousarray(q), f"{base}_q{bits}"),
            numpy_helper.from_array(sc.reshape(-1), f"{base}_scale"),
            numpy_helper.from_array(zp.reshape(-1), f"{base}_zp"),
        ])  # fmt: skip
        new_nodes.append(helper.make_node(
            "MatMulNBits", [n.input[0], f"{base}_q{bits}", f"{base}_scale", f"{base}_zp"], list(n.output),
            name=(n.name or base) + "_nbits", domain="com.microsoft", K=k, N=nn_, bits=bits, block_size=block,
            accuracy_level=accuracy_level,
        ))  # fmt: skip
        if used.get(base, 0) == 1:
            drop.add(base)
        n_q += 1
    del g.node[:]
    g.node.extend(new_nodes)
    keep = [i for i in g.initializer if i.name not in drop]
    del g.initializer[:]
    g.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst))
    return n_q

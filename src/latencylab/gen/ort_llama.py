"""A Llama-family causal LM as one ONNX graph for ONNX Runtime, its K/V cache in buffers the caller owns.

Why: on a CPU the eager decode step of a 135M model spends more time in Python and small ops (norms, RoPE,
attention, dispatch) than in its weight reads; one ORT graph runs the whole step in C++
(docs/benchmarks/optimize-gen.md, "Session 25: the model as one ONNX Runtime graph"). The graph is written
op by op from the HF model's weights (no tracing, no HF cache classes) with ORT's fused CPU kernels:

    (input_ids [1, S], seqlens_k [1] (int32: T + S - 1), total_sequence_length (int32: T + S),
     past_k.i, past_v.i [1, Hkv, C, D] for each layer i)
        -> (logits [1, S or 1, V], present_k.i, present_v.i [1, Hkv, C, D])

Each layer's attention is ``com.microsoft.GroupQueryAttention`` over the packed q|k|v projection, RoPE inside it
(tables of the model's positions), causal over the ``T`` cached and the ``S`` new positions; the caller binds
``present_*.i`` to the same buffers as ``past_*.i`` (capacity ``C``), so the kernel writes the new positions in
place: no cache copy a step (the earlier graph concatenated and restacked the whole cache, ~4 ms a step at 160
positions here), and cutting a rejected draft is moving ``T`` back. RMS norms are ORT's (Skip)Simplified
LayerNormalization, the residual add fused in. ``last_only`` keeps the LM head to the last position
(generation); without it every position's logits come back (verification, perplexity, forced agreement).
Linear weights are ``MatMul`` initializers [K, N] named ``layers.i.{qkv,o,gateup,down}`` and ``head``, so
:func:`quantize_matmuls` can swap them for ORT's blockwise ``MatMulNBits``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["check_llama", "export_llama", "head_dim", "quantize_matmuls"]


def head_dim(cfg: Any) -> int:
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def check_llama(model: Any) -> None:
    """Refuse (one line) a model the graph does not reproduce."""
    cfg = model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise LatencyLabError(f"ONNX Runtime decode supports Llama-family models, not {cfg.model_type!r}")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise LatencyLabError(f"ONNX Runtime decode: rope type {rope.get('rope_type')!r} not supported")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise LatencyLabError("ONNX Runtime decode: biased attention/MLP projections not supported")
    if head_dim(cfg) % 16:
        raise LatencyLabError(
            f"ONNX Runtime decode: head size {head_dim(cfg)} (GroupQueryAttention on the CPU takes multiples of 16)"
        )
    if str(getattr(cfg, "hidden_act", "silu")) != "silu":
        raise LatencyLabError(f"ONNX Runtime decode: activation {cfg.hidden_act!r} not supported (silu)")


def _rope_tables(cfg: Any, hd: int) -> tuple[Any, Any]:
    """cos, sin [positions, head_dim / 2] as HF computes them (float32 inverse frequencies and positions)."""
    import torch

    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.arange(int(cfg.max_position_embeddings), dtype=torch.float32)
    freqs = pos[:, None] * inv[None, :]
    return freqs.cos().numpy(), freqs.sin().numpy()


def export_llama(model: Any, path: Path, last_only: bool = True) -> Path:
    """Write ``model`` (an HF LlamaForCausalLM) as the graph of the module docstring to ``path``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    check_llama(model)
    cfg = model.config
    hd = head_dim(cfg)
    nh, nkv, eps = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), float(cfg.rms_norm_eps)
    inter, n_layers = int(cfg.intermediate_size), int(cfg.num_hidden_layers)
    inits: list[Any] = []
    nodes: list[Any] = []

    def init(name: str, arr: Any) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), name))
        return name

    def w(lin_weights: Sequence[Any], name: str) -> str:  # Linear weights [N, K] (concatenated) -> MatMul [K, N]
        import torch

        return init(name, torch.cat([x.detach().float() for x in lin_weights]).t().numpy())

    def node(op: str, ins: Sequence[str], outs: Sequence[str], domain: str = "", **attrs: Any) -> None:
        nodes.append(helper.make_node(op, list(ins), list(outs), name=outs[0], domain=domain, **attrs))

    inner = model.model
    cos, sin = _rope_tables(cfg, hd)
    init("cos_cache", cos)
    init("sin_cache", sin)
    init("embed", inner.embed_tokens.weight.detach().float().numpy())
    node("Gather", ["embed", "input_ids"], ["x0"])
    res = "x0"
    kv_in, kv_out = [], []
    for i, ly in enumerate(inner.layers):
        a, m = ly.self_attn, ly.mlp
        ln2 = init(f"layers.{i}.ln2", ly.post_attention_layernorm.weight.detach().float().numpy())
        if i == 0:
            ln1 = init("layers.0.ln1", ly.input_layernorm.weight.detach().float().numpy())
            node("SimplifiedLayerNormalization", [res, ln1], ["h0"], axis=-1, epsilon=eps)
        # every later norm takes the residual add with it (the sum is its 4th output, the next residual)
        qkv = w([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], f"layers.{i}.qkv")
        node("MatMul", [f"h{i}", qkv], [f"qkv{i}"])
        pk, pv = f"past_k.{i}", f"past_v.{i}"
        kv_in += [pk, pv]
        kv_out += [f"present_k.{i}", f"present_v.{i}"]
        node("GroupQueryAttention",
             [f"qkv{i}", "", "", pk, pv, "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
             [f"att{i}", f"present_k.{i}", f"present_v.{i}"], domain="com.microsoft", num_heads=nh,
             kv_num_heads=nkv, do_rotary=1, rotary_interleaved=0)  # fmt: skip
        node("MatMul", [f"att{i}", w([a.o_proj.weight], f"layers.{i}.o")], [f"o{i}"])
        node("SkipSimplifiedLayerNormalization", [f"o{i}", res, ln2], [f"m{i}", "", "", f"r{i}"],
             domain="com.microsoft", epsilon=eps)  # fmt: skip
        node("MatMul", [f"m{i}", w([m.gate_proj.weight, m.up_proj.weight], f"layers.{i}.gateup")], [f"gu{i}"])
        node("Split", [f"gu{i}", "split_sizes"], [f"g{i}", f"u{i}"], axis=-1)
        node("Sigmoid", [f"g{i}"], [f"sg{i}"])
        node("Mul", [f"g{i}", f"sg{i}"], [f"silu{i}"])
        node("Mul", [f"silu{i}", f"u{i}"], [f"act{i}"])
        node("MatMul", [f"act{i}", w([m.down_proj.weight], f"layers.{i}.down")], [f"d{i}"])
        last = i == n_layers - 1
        norm = (inner.norm if last else inner.layers[i + 1].input_layernorm).weight.detach().float().numpy()
        gamma = init("norm" if last else f"layers.{i + 1}.ln1", norm)
        nxt = "hf" if last else f"h{i + 1}"
        node("SkipSimplifiedLayerNormalization", [f"d{i}", f"r{i}", gamma], [nxt, "", "", f"x{i + 1}"],
             domain="com.microsoft", epsilon=eps)  # fmt: skip
        res = f"x{i + 1}"
    inits.append(numpy_helper.from_array(np.array([inter, inter], np.int64), "split_sizes"))
    hf = "hf"
    if last_only:  # the LM head on the last position only
        for name, val in (("last_start", -1), ("last_end", 2**62), ("axis1", 1)):
            inits.append(numpy_helper.from_array(np.array([val], np.int64), name))
        node("Slice", ["hf", "last_start", "last_end", "axis1"], ["hl"])
        hf = "hl"
    node("MatMul", [hf, w([model.lm_head.weight], "head")], ["logits"])
    kv: list[str | int | None] = [1, nkv, "capacity", hd]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "llama_step",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
         *[helper.make_tensor_value_info(n, f32, kv) for n in kv_in]],
        [helper.make_tensor_value_info("logits", f32, [1, "out", int(cfg.vocab_size)]),
         *[helper.make_tensor_value_info(n, f32, kv) for n in kv_out]],
        inits,
    )  # fmt: skip
    m_ = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m_.ir_version = 8
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m_, str(path))
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

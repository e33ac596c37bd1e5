"""The packed engine: a step's prefill chunks and its decode batch in **one** forward (Sarathi-Serve's mixed batch).

:class:`~latencylab.genserve.engine.TorchEngine` runs a prefill chunk as its own forward and the decode batch as
another. On this CPU every forward reads all the weights once (~540 MB in FP32 for SmolLM2-135M: ~60 ms on one
core, the whole cost of a decode step at batch 1), so a step that prefills a chunk and decodes pays that fixed
cost twice, and a per-gap (ITL) cap leaves a prompt only what the decode forward does not use (session 20: 553
tokens in 14 steps of ~40 tokens, TTFT 4.7 -> 9.5 s). Here the step's tokens, every prefill chunk's and one per
decoding sequence, are laid end to end in one stream of ``N`` tokens (batch 1, no padding): each ``nn.Linear``
(the attention projections, the MLP, the LM head for the rows that need logits) is one ``[N, hidden]`` matrix
product, so the decode rows ride on the chunk's weight read. Only attention is per sequence: each segment of
the stream (a chunk, or one decode token) attends to its own sequence's K/V with ``scaled_dot_product_attention``
(causal within a chunk, offset by what its cache already holds).

**KV layout: a per-slot static cache.** Each sequence gets its own K/V buffers at its first chunk, sized for its
whole reservation (prompt + ``max_tokens`` - 1 positions, what the scheduler reserved at admission, so a buffer
never grows), and the step writes the new positions in place. Nothing is re-packed when a sequence joins or
leaves and nothing is copied per step (the padded engine's ``DynamicCache`` appends with ``torch.cat``, a copy of
each layer's K/V every step, and re-packs the batch on every join and leave); the price is attention run once per
sequence per layer instead of once per batch (Python dispatch: tens of microseconds each). Measured side by side
in ``benchmarks/gen_serve_engine.py`` (docs/benchmarks/generative.md, session 21).

Positions: a chunk ``[start, end)`` gets RoPE positions ``start .. end - 1``, a decode token its sequence's
length, exactly as the model's own forward over the same cache would, so greedy outputs match
:class:`~latencylab.genserve.engine.TorchEngine` up to float summation order (tests/test_genserve_packed.py checks
logits against the model's forward and greedy tokens against plain decoding).

**Speculative decoding (greedy, prompt lookup).** :meth:`PackedEngine.mixed_spec` takes, per decoding sequence,
up to ``k`` drafted tokens (the scheduler's prompt lookup: the tokens that followed the latest earlier occurrence of
the context's last n-gram, ``latencylab.gen.drafts.lookup``) and verifies them in the same forward: the sequence's
segment is ``[tokens[-1], d1 .. dk]`` at positions ``length .. length + k``, causal, a verify chunk exactly as a
prefill chunk is. The longest prefix of drafts equal to the model's own greedy choices is kept, plus the model's
token after it (the first disagreement's correction, or a bonus token when every draft held); the sequence's
length grows by one plus the drafts kept, so the positions of the rejected drafts are simply overwritten by the
next step (the per-slot cache needs no roll-back copy). Greedy output is token-identical to plain decoding up to
float summation order (tests/test_genserve_packed.py). Sampled sequences are never drafted for.

Llama-family models only (``model.model.layers[i].self_attn.{q,k,v,o}_proj``, ``mlp``, the two RMS norms,
``rotary_emb``): SmolLM2 is one. Any ``nn.Linear`` replacement (PyTorch dynamic INT8, the weight-only INT8
module) works, since the projections are called as modules. A BF16 prefill model is not supported here (one
forward cannot run two dtypes): the server refuses that combination.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.genserve.engine import decode_config
from latencylab.genserve.scheduler import Seq
from latencylab.workloads.gen_decode import pick

__all__ = ["PackedEngine", "supports_packed"]


def supports_packed(model: Any) -> str:
    """Why ``model`` cannot run in the packed engine ("" when it can)."""
    inner: Any = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"the model has no model.{name} (the packed engine runs Llama-family decoders)"
    if not hasattr(model, "lm_head"):
        return "the model has no lm_head"
    layer = inner.layers[0]
    attn = getattr(layer, "self_attn", None)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(attn, name):
            return f"its attention has no {name}"
    for name in ("mlp", "input_layernorm", "post_attention_layernorm"):
        if not hasattr(layer, name):
            return f"its decoder layer has no {name}"
    return ""


class _Slot:
    """One sequence's K/V: ``keys``/``values`` [layers, kv_heads, capacity, head_dim]; ``length`` positions hold
    real tokens."""

    __slots__ = ("keys", "length", "values")

    def __init__(self, keys: Any, values: Any) -> None:
        self.keys = keys
        self.values = values
        self.length = 0


class PackedEngine:
    """:class:`~latencylab.genserve.scheduler.Engine` with :meth:`mixed`: prefill chunks and a decode batch in one
    forward (see the module docstring)."""

    fused = True  # the scheduler runs a step's chunks and decode batch through mixed()

    def __init__(self, model: Any) -> None:
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        why = supports_packed(model)
        if why:
            raise LatencyLabError(f"the packed engine cannot run this model: {why}")
        self.torch = torch
        self.model = model
        self._rope = apply_rotary_pos_emb
        cfg = model.config
        self.n_layers = len(model.model.layers)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.dtype = model.model.embed_tokens.weight.dtype
        self._slots: dict[int, _Slot] = {}  # seq id -> its K/V
        self.prefix: Any = None  # a PrefixKV (genserve/prefix.py), or None
        self.forwards = 0
        self.last_logits: Any = None  # the last forward's logits, one row per token chosen (tests read them)

    # -- the prefix cache (as TorchEngine's) ---------------------------------------------------------------

    def set_prefix(self, ids: Sequence[int]) -> None:
        """Prefill ``ids`` once (the model's own forward) and seed every prompt that starts with them."""
        from transformers import DynamicCache

        from latencylab.genserve.engine import _cache_kwarg
        from latencylab.genserve.prefix import PrefixKV

        model = self.model
        self.prefix = (
            PrefixKV.build(model, ids, _cache_kwarg(model), lambda: DynamicCache(config=model.config)) if ids else None
        )

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        return 0 if self.prefix is None else self.prefix.match(prompt_ids)

    # -- the Engine protocol ---------------------------------------------------------------------------------

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        firsts, _ = self.mixed([(seq, start, end)], [])
        return firsts[0]

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        _, out = self.mixed([], seqs)
        return out

    def release(self, seq: Seq) -> None:
        seq.engine_state = None
        self._slots.pop(seq.id, None)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V buffers held (each sized for its sequence's whole reservation)."""
        return sum(int(s.keys.nbytes + s.values.nbytes) for s in self._slots.values())

    # -- the mixed step ------------------------------------------------------------------------------------

    def _slot(self, seq: Seq, start: int) -> _Slot:
        torch = self.torch
        slot = seq.engine_state
        if not isinstance(slot, _Slot):  # the sequence's first chunk: its buffers, for its whole reservation
            cap = max(seq.req.kv_tokens, seq.prompt_len)
            shape = (self.n_layers, self.n_kv, cap, self.head_dim)
            slot = _Slot(torch.empty(shape, dtype=self.dtype), torch.empty(shape, dtype=self.dtype))
            seq.engine_state = slot
            self._slots[seq.id] = slot
            if start:  # after a cached prefix: copy its K/V in
                if self.prefix is None or self.prefix.match(seq.req.prompt_ids) < start:
                    raise RuntimeError(f"sequence {seq.id}: prefill from {start} without that prefix cached")
                for li, (k, v) in enumerate(self.prefix.layers):
                    slot.keys[li, :, :start] = k[0, :, :start]
                    slot.values[li, :, :start] = v[0, :, :start]
                slot.length = start
            if seq.req.sampling.seed is not None:
                seq.generator = torch.Generator()
                seq.generator.manual_seed(seq.req.sampling.seed)
        if slot.length != start:
            raise RuntimeError(f"sequence {seq.id}: prefill from {start} but its cache holds {slot.length}")
        return slot

    def mixed(self, chunks: Sequence[tuple[Seq, int, int]], seqs: Sequence[Seq]) -> tuple[list[int | None], list[int]]:
        """One forward over prompt chunks ``(seq, start, end)`` and one token for each sequence in ``seqs`` (each
        has ``tokens[-1]`` not yet in its cache). Returns each chunk's first output token (None for a chunk
        that does not end its prompt) and each decoding sequence's next token."""
        firsts, outs = self.mixed_spec(chunks, seqs, [()] * len(seqs))
        return firsts, [o[0] for o in outs]

    def mixed_spec(
        self, chunks: Sequence[tuple[Seq, int, int]], seqs: Sequence[Seq], drafts: Sequence[Sequence[int]]
    ) -> tuple[list[int | None], list[list[int]]]:
        """:meth:`mixed` with ``drafts[i]`` (greedy sequences only; may be empty) verified for ``seqs[i]`` in the same
        forward (module docstring): each decoding sequence's tokens of this step, one to ``len(drafts[i]) + 1``."""
        torch = self.torch
        if len(drafts) != len(seqs):
            raise ValueError("one draft (perhaps empty) per decoding sequence")
        ids: list[int] = []
        pos: list[int] = []
        segs: list[tuple[_Slot, int, int]] = []  # (slot, positions before the segment, tokens)
        need: list[int] = []  # stream rows whose logits are wanted
        for seq, start, end in chunks:
            if not 0 <= start < end <= seq.prompt_len:
                raise ValueError(f"sequence {seq.id}: bad chunk [{start}, {end}) of a {seq.prompt_len}-token prompt")
            slot = self._slot(seq, start)
            ids.extend(seq.req.prompt_ids[start:end])
            pos.extend(range(start, end))
            segs.append((slot, start, end - start))
            if end == seq.prompt_len:
                need.append(len(ids) - 1)
        for seq, draft in zip(seqs, drafts, strict=True):
            slot = seq.engine_state
            if not isinstance(slot, _Slot) or slot.length < seq.prompt_len:
                raise RuntimeError(f"sequence {seq.id} decodes before its prefill ended")
            if draft and seq.req.sampling.temperature > 0:
                raise ValueError(f"sequence {seq.id}: drafts are verified greedily; it samples")
            n = 1 + len(draft)
            if slot.length + n > slot.keys.shape[2]:
                raise ValueError(f"sequence {seq.id}: {len(draft)} drafts overrun its reserved cache")
            ids.append(seq.tokens[-1])
            ids.extend(int(t) for t in draft)
            pos.extend(range(slot.length, slot.length + n))
            segs.append((slot, slot.length, n))
            need.extend(range(len(ids) - n, len(ids)))
        if not ids:
            return [], []
        with torch.inference_mode():
            logits = self._forward(ids, pos, segs, need)
        self.forwards += 1
        self.last_logits = logits
        for slot, p0, n in segs:
            slot.length = p0 + n
        rows = iter(range(len(need)))
        outs: list[list[int]] = []
        with torch.inference_mode():
            firsts = [
                pick(logits[next(rows)], decode_config(seq.req.sampling), seq.generator) if end == seq.prompt_len
                else None
                for seq, _start, end in chunks
            ]  # fmt: skip
            for s, draft, (slot, p0, n) in zip(seqs, drafts, segs[len(chunks) :], strict=True):
                got: list[int] = []
                for j, row in enumerate([next(rows) for _ in range(n)]):  # row j: the token after position p0 + j
                    got.append(pick(logits[row], decode_config(s.req.sampling), s.generator))
                    if j == len(draft) or got[-1] != int(draft[j]):  # the bonus token, or the first disagreement
                        break
                slot.length = p0 + len(got)  # tokens[-1] and the drafts kept; the rejected ones are overwritten
                outs.append(got)
        return firsts, outs

    def _forward(self, ids: list[int], pos: list[int], segs: list[tuple[_Slot, int, int]], need: list[int]) -> Any:
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        inner = self.model.model
        n_tok = len(ids)
        x = torch.tensor([ids], dtype=torch.long)
        h = inner.embed_tokens(x)  # [1, N, hidden]
        cos, sin = inner.rotary_emb(h, torch.tensor([pos], dtype=torch.long))
        # per segment: its rows in the stream and its mask (None: one token, or a chunk from position 0 = causal)
        plan = []
        o = 0
        for slot, p0, n in segs:
            mask = None
            if n > 1 and p0 > 0:  # causal, offset by the p0 positions already cached
                mask = torch.ones((n, p0 + n), dtype=torch.bool).tril(diagonal=p0)
            plan.append((slot, p0, n, o, mask))
            o += n
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        gqa = nh != nkv
        for li, layer in enumerate(inner.layers):
            attn = layer.self_attn
            a = layer.input_layernorm(h)
            q = attn.q_proj(a).view(1, n_tok, nh, hd).transpose(1, 2)
            k = attn.k_proj(a).view(1, n_tok, nkv, hd).transpose(1, 2)
            v = attn.v_proj(a).view(1, n_tok, nkv, hd).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            parts = []
            for slot, p0, n, off, mask in plan:
                keys, values = slot.keys[li], slot.values[li]  # [kv_heads, capacity, head_dim]
                keys[:, p0 : p0 + n] = k[0, :, off : off + n]
                values[:, p0 : p0 + n] = v[0, :, off : off + n]
                parts.append(
                    sdpa(
                        q[:, :, off : off + n],
                        keys[None, :, : p0 + n],
                        values[None, :, : p0 + n],
                        attn_mask=mask,
                        is_causal=n > 1 and p0 == 0,
                        scale=attn.scaling,
                        enable_gqa=gqa,
                    )
                )
            y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # [1, heads, N, head_dim]
            h = h + attn.o_proj(y.transpose(1, 2).reshape(1, n_tok, nh * hd))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if not need:  # chunks that end no prompt and no decode rows: no token to choose, no LM head to run
            return None
        last = inner.norm(h[:, need])  # only the rows whose next token is wanted
        return self.model.lm_head(last)[0].float()

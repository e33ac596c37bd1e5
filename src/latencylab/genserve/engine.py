"""The real model behind the scheduler: chunked prefill per sequence, one padded forward per decode step.

Layout: **one shared, left-padded DynamicCache for the decode batch**, with a per-row attention mask and
per-row position ids, re-packed only when the batch's membership changes (a sequence joins after its prefill,
or leaves). Each step then is one ``model(...)`` call of shape [batch, 1] over that cache.

Why this and not per-sequence caches concatenated every step: DynamicCache already copies each layer's K/V
once per step (``torch.cat`` to append the new position), whatever the layout; per-sequence caches would add
a second whole-cache copy every step (pad + concatenate B caches into a batch, then split the new position
back out), while the shared cache pays that copy only on a join or leave, which is rare next to decode steps
(a reply is tens to hundreds of steps). The measured cost per step at batch 1/4/8 is in docs/serve.md
("Generative serving"), from ``benchmarks/gen_serve_engine.py``.

A sequence's prefill runs in its own batch-1 cache, in chunks (the scheduler's prefill budget), with the
model's implicit positions; at its first decode step its cache joins the shared one. Left padding is masked
(attention weight exactly 0), and RoPE positions come from each row's own length, so a row computes what it
would alone, up to float summation order (the slow test checks greedy outputs token for token).

A prefix cache (genserve/prefix.py; :meth:`TorchEngine.set_prefix`): a prompt that starts with the chat
template's fixed prefix begins its own cache with a copy of the prefix's K/V and prefills only the rest
(:meth:`TorchEngine.cached_prefix` tells the scheduler how many tokens that skips).

A prefill model (``prefill_model``; genserve/prefill.py): the prompt's forward runs through a lower-precision
copy of the same weights (bfloat16, on a CPU with native BF16 matrix instructions ~3x the FP32 prefill here) and
its K/V are cast to the decode model's dtype when the sequence joins the batch; decode stays FP32. It changes
the numbers (the K/V and the first token come from BF16 arithmetic): opt-in, with its token agreement measured.

Sampling per row: :func:`latencylab.workloads.gen_decode.pick` (greedy; temperature, top-p, with the
sequence's own seeded ``torch.Generator``), so a seeded request draws the same tokens whatever else runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from latencylab.genserve.scheduler import Sampling, Seq
from latencylab.workloads.gen_decode import DecodeConfig, pick

__all__ = ["TorchEngine", "decode_config"]


def decode_config(s: Sampling) -> DecodeConfig:
    return DecodeConfig(temperature=s.temperature, top_p=s.top_p)


class _Own:
    """A sequence's cache before it joins the batch: its own batch-1 DynamicCache."""

    __slots__ = ("cache", "length")

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.length = 0


class TorchEngine:
    """:class:`~latencylab.genserve.scheduler.Engine` over a transformers causal LM (see the module docstring)."""

    def __init__(self, model: Any, prefill_model: Any = None) -> None:
        import torch
        from transformers import DynamicCache

        self.torch = torch
        self.model = model
        # the prompt's forward (its K/V cast to the decode model's dtype at the join): genserve/prefill.py
        self.prefill_model = prefill_model if prefill_model is not None else model
        self._decode_dtype = next(model.parameters()).dtype
        self._new_cache = lambda: DynamicCache(config=model.config)
        self._kwarg = _cache_kwarg(model)
        self._rows: list[int] = []  # seq ids, in the shared cache's row order
        self._lens: dict[int, int] = {}  # seq id -> real positions in its row
        self._cache: Any = None
        self._released: set[int] = set()  # rows whose sequences left (dropped at the next re-pack)
        self.repacks = 0
        self.prefix: Any = None  # a PrefixKV (genserve/prefix.py), or None: no prefix cache

    # -- the prefix cache ---------------------------------------------------------------------------------

    def set_prefix(self, ids: Sequence[int]) -> None:
        """Prefill ``ids`` once and reuse their K/V for every prompt that starts with them (empty: none)."""
        from latencylab.genserve.prefix import PrefixKV

        self.prefix = PrefixKV.build(self.prefill_model, ids, self._kwarg, self._new_cache) if ids else None

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """Leading prompt tokens whose K/V the prefix cache holds (a prefill may start there)."""
        return 0 if self.prefix is None else self.prefix.match(prompt_ids)

    # -- prefill ------------------------------------------------------------------------------------------

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        torch = self.torch
        if not isinstance(seq.engine_state, _Own):  # the sequence's first chunk
            seq.engine_state = _Own(self._new_cache())
            if start:  # it starts after a cached prefix: its cache begins with a copy of the prefix's K/V
                if self.prefix is None or self.prefix.match(seq.req.prompt_ids) < start:
                    raise RuntimeError(f"sequence {seq.id}: prefill from {start} without that prefix cached")
                self.prefix.seed(seq.engine_state.cache, start)
                seq.engine_state.length = start
            if seq.req.sampling.seed is not None:
                seq.generator = torch.Generator()
                seq.generator.manual_seed(seq.req.sampling.seed)
        own: _Own = seq.engine_state
        if own.length != start:
            raise RuntimeError(f"sequence {seq.id}: prefill from {start} but its cache holds {own.length}")
        ids = torch.tensor([list(seq.req.prompt_ids[start:end])], dtype=torch.long)
        with torch.inference_mode():
            out = self.prefill_model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._kwarg: own.cache})
        own.length = end
        if end < seq.prompt_len:
            return None
        if self.prefill_model is not self.model:  # the decode batch reads its K/V in the decode model's dtype
            for layer in own.cache.layers:
                layer.keys = layer.keys.to(self._decode_dtype)
                layer.values = layer.values.to(self._decode_dtype)
        with torch.inference_mode():
            return pick(out.logits[0, -1].float(), decode_config(seq.req.sampling), seq.generator)

    # -- decode -------------------------------------------------------------------------------------------

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        torch = self.torch
        ids = [s.id for s in seqs]
        if ids != self._rows:
            self._repack(seqs)
        lens = [self._lens[i] for i in ids]
        width = max(lens)
        mask = torch.zeros((len(seqs), width + 1), dtype=torch.long)
        for r, n in enumerate(lens):
            mask[r, width - n :] = 1
        positions = torch.tensor([[n] for n in lens], dtype=torch.long)
        x = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.long)
        with torch.inference_mode():
            out = self.model(
                input_ids=x, attention_mask=mask, position_ids=positions, use_cache=True, **{self._kwarg: self._cache}
            )
            logits = out.logits[:, -1]
            chosen = [pick(logits[r], decode_config(s.req.sampling), s.generator) for r, s in enumerate(seqs)]
        for i in ids:
            self._lens[i] += 1
        return chosen

    def _repack(self, seqs: Sequence[Seq]) -> None:
        """Rebuild the shared cache for exactly ``seqs`` (in order): rows already in it keep their real
        positions, joining ones bring their own cache; every row is left-padded to the longest."""
        torch = self.torch
        self.repacks += 1
        old_rows = {sid: r for r, sid in enumerate(self._rows)}
        old = self._cache
        parts: list[tuple[Any, int, int]] = []  # (cache, row, length) per sequence
        for s in seqs:
            if s.id in old_rows:
                parts.append((old, old_rows[s.id], self._lens[s.id]))
            else:
                own = s.engine_state
                if not isinstance(own, _Own) or own.length != s.prompt_len:
                    raise RuntimeError(f"sequence {s.id} joins the batch before its prefill ended")
                parts.append((own.cache, 0, own.length))
                self._lens[s.id] = own.length
        width = max(n for _, _, n in parts)
        new = self._new_cache()
        n_layers = len(parts[0][0].layers)
        for li in range(n_layers):
            ks, vs = [], []
            for cache, row, n in parts:
                layer = cache.layers[li]
                have = layer.keys.shape[-2]
                k = layer.keys[row : row + 1, :, have - n :, :]
                v = layer.values[row : row + 1, :, have - n :, :]
                if n < width:
                    pad = (0, 0, width - n, 0)
                    k = torch.nn.functional.pad(k, pad)
                    v = torch.nn.functional.pad(v, pad)
                ks.append(k)
                vs.append(v)
            new.update(torch.cat(ks, dim=0), torch.cat(vs, dim=0), li)
        for s in seqs:
            if isinstance(s.engine_state, _Own):
                s.engine_state = None  # its cache is in the shared one now
        self._cache = new
        self._rows = [s.id for s in seqs]
        self._lens = {s.id: self._lens[s.id] for s in seqs}
        self._released.clear()

    def release(self, seq: Seq) -> None:
        """Forget ``seq``: its own cache now; its row in the shared cache at the next re-pack."""
        seq.engine_state = None
        if seq.id not in self._rows:
            self._lens.pop(seq.id, None)
            return
        self._released.add(seq.id)
        if self._released.issuperset(self._rows):  # the batch is empty: give its memory back now
            self._cache, self._rows, self._lens = None, [], {}
            self._released.clear()

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V the shared cache holds (padding included)."""
        if self._cache is None:
            return 0
        return sum(int(layer.keys.nbytes + layer.values.nbytes) for layer in self._cache.layers)


def _cache_kwarg(model: Any) -> str:
    """``cache`` (newer transformers) or ``past_key_values``, as the model's forward names it."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"

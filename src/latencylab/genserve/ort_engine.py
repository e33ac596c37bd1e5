"""The ONNX Runtime engine: ``serve --model gen --from DIR`` for a choice of the ``ort-*`` family of
``optimize --workload gen`` (the model as one ORT graph, ``gen/ort_llama.py``), with its INT8 draft when it has one.

A fused engine (``fused = True``: the scheduler hands it a step's prefill chunks and its decoding sequences
at once, :meth:`mixed`), but unlike :class:`~latencylab.genserve.packed.PackedEngine` its graph takes one
sequence a forward (batch 1, constant reshapes: the reason it is fast at batch 1): a step runs each chunk and
each decoding sequence as its own forward. So it is a low-latency engine, not a throughput one: TPOT grows
with the batch about linearly, where the packed engine's decode rows share one weight read (measured side by
side: docs/benchmarks/speculative.md, "Served"). Each sequence owns a :class:`~latencylab.gen.ort_decode.KVCache`
sized for its reservation (prompt + ``max_tokens`` + the draft's ``k``), written in place.

**Speculative decoding with the INT8 draft** (``draft`` given): in a step with at most ``spec_max_batch``
decoding sequences, each one gets a verify step instead of a plain one (:meth:`mixed_drafted`): the draft (the
graph's blockwise-INT8 copy) proposes up to ``k`` tokens over the sequence's own cache buffers (no cache of its
own, as ``gen/ort_spec.py``), the target runs ``[last, d1 .. dk]`` as one causal chunk, and

* a greedy sequence keeps the longest prefix equal to the target's argmax plus the target's next token: its
  tokens are the target graph's plain greedy tokens;
* a sampled one (temperature > 0) keeps each draft with probability ``min(1, p/q)`` and, at the first rejection,
  draws from ``norm(max(0, p - q))``, else one more from ``p`` (``gen.speculative.accept_sampled``, Leviathan et
  al.): its tokens are distributed as plain sampling from the target (tests/test_genserve_ort.py checks it).

The rejected positions are only cut by length: the next step writes over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from latencylab.genserve.engine import decode_config
from latencylab.genserve.sched_types import Seq
from latencylab.workloads.gen_decode import pick

__all__ = ["OrtEngine"]


class OrtEngine:
    """:class:`~latencylab.genserve.scheduler.Engine` over an :class:`~latencylab.gen.ort_decode.OrtLM`."""

    fused = True
    drafts_itself = True  # the scheduler calls mixed_drafted (the engine drafts; no prompt-lookup drafts)

    def __init__(self, target: Any, draft: Any = None, k: int = 4, spec_max_batch: int = 4) -> None:
        """``draft``: None (plain decoding), an ``OrtLM`` over the same cache layout (the INT8 copy), or
        ``"lookup"`` (prompt-lookup drafts for greedy sequences)."""
        import torch

        self.torch = torch
        self.target, self.draft, self.k, self.spec_max_batch = target, draft, k, spec_max_batch
        self._caches: dict[int, Any] = {}
        self.forwards = 0
        kind = "prompt-lookup" if draft == "lookup" else "INT8-graph"
        what = "" if draft is None else f"; {kind} drafts, k = {k}, in steps of <= {spec_max_batch} sequences"
        self.label = f"ONNX Runtime engine (one graph forward a sequence{what})"

    # -- the Engine protocol ---------------------------------------------------------------------------------

    def set_prefix(self, ids: Sequence[int]) -> None:  # no prefix cache: every prompt is prefilled whole
        return None

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        return 0

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        firsts, _ = self.mixed([(seq, start, end)], [])
        return firsts[0]

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        _, out = self.mixed([], seqs)
        return out

    def release(self, seq: Seq) -> None:
        seq.engine_state = None
        self._caches.pop(seq.id, None)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K/V buffers held (each sized for its sequence's reservation)."""
        per = 2 * self.target.layers * self.target.kv_heads * self.target.head_dim * 4  # K and V, float32
        return sum(c.capacity * per for c in self._caches.values())

    # -- steps -------------------------------------------------------------------------------------------------

    def mixed(self, chunks: Sequence[tuple[Seq, int, int]], seqs: Sequence[Seq]) -> tuple[list[int | None], list[int]]:
        """Each chunk, then each sequence's next token, one forward each (plain decoding)."""
        firsts = self._chunks(chunks)
        return firsts, [self._plain(s) for s in seqs]

    def mixed_drafted(
        self, chunks: Sequence[tuple[Seq, int, int]], seqs: Sequence[Seq]
    ) -> tuple[list[int | None], list[list[int]], int, int]:
        """As :meth:`mixed`, with a draft-and-verify step for each decoding sequence when there is a draft and at
        most ``spec_max_batch`` of them: (first tokens, each sequence's new tokens, drafted, kept)."""
        firsts = self._chunks(chunks)
        if self.draft is None or len(seqs) > self.spec_max_batch:
            return firsts, [[self._plain(s)] for s in seqs], 0, 0
        outs, drafted, kept = [], 0, 0
        for s in seqs:
            new, d = self._verify(s)
            outs.append(new)
            drafted, kept = drafted + d, kept + len(new) - 1
        return firsts, outs, drafted, kept

    # -- internals -----------------------------------------------------------------------------------------------

    def _cache(self, seq: Seq) -> Any:
        c = self._caches.get(seq.id)
        if c is None:
            c = self.target.empty_cache(seq.prompt_len + seq.req.max_tokens + self.k + 1)
            self._caches[seq.id] = seq.engine_state = c
            if seq.req.sampling.seed is not None and seq.req.sampling.temperature > 0:
                seq.generator = self.torch.Generator()
                seq.generator.manual_seed(seq.req.sampling.seed)
        return c

    def _pick(self, logits: Any, seq: Seq) -> int:
        return pick(self.torch.from_numpy(logits), decode_config(seq.req.sampling), seq.generator)

    def _chunks(self, chunks: Sequence[tuple[Seq, int, int]]) -> list[int | None]:
        firsts: list[int | None] = []
        for seq, start, end in chunks:
            logits = self.target.run(seq.req.prompt_ids[start:end], self._cache(seq))
            self.forwards += 1
            firsts.append(self._pick(logits[-1], seq) if end == seq.prompt_len else None)
        return firsts

    def _plain(self, seq: Seq) -> int:
        logits = self.target.run(seq.tokens[-1:], self._cache(seq))
        self.forwards += 1
        return self._pick(logits[-1], seq)

    def _verify(self, seq: Seq) -> tuple[list[int], int]:
        """One draft-and-verify step of ``seq``: (its new tokens, how many were drafted)."""
        import numpy as np

        from latencylab.gen.speculative import Sampler, accept_sampled

        kk = min(self.k, seq.req.max_tokens - len(seq.tokens) - 1)
        s = seq.req.sampling
        sampler = Sampler(s.temperature, s.top_p, seq.generator) if s.temperature > 0 else None
        drafts: list[int] = []
        qs: list[Any] = []
        if kk >= 1 and self.draft == "lookup":  # prompt lookup: no model, greedy sequences only
            from latencylab.gen.drafts import lookup

            drafts = list(lookup([*seq.req.prompt_ids, *seq.tokens], kk)) if sampler is None else []
            kk = len(drafts)
        if kk < 1:
            return [self._plain(seq)], 0
        cache = self._cache(seq)
        last, length = seq.tokens[-1], cache.length
        if not drafts:
            dc, feed = cache.share(), [last]
            for _ in range(kk):
                lg = self.draft.run(feed, dc)[-1]
                if sampler is None:
                    drafts.append(int(np.argmax(lg)))
                else:
                    q = sampler.probs(self.torch.from_numpy(lg))
                    qs.append(q)
                    drafts.append(sampler.draw(q))
                feed = drafts[-1:]
            self.forwards += kk
        logits = self.target.run([last, *drafts], cache, every=True)
        self.forwards += 1
        if sampler is None:
            greedy = np.argmax(logits, axis=-1)
            a = 0
            while a < kk and drafts[a] == int(greedy[a]):
                a += 1
            nxt = int(greedy[a])
        else:
            p = sampler.probs(self.torch.from_numpy(logits))
            a, nxt = accept_sampled(p, self.torch.stack(qs), drafts, sampler)
        self.target.cut(cache, length + 1 + a)  # the last token and the kept drafts
        return [*drafts[:a], nxt], kk

"""Greedy decoding of a Llama-family model through ONNX Runtime (the graph of :mod:`latencylab.gen.ort_llama`).

``OrtLM`` holds two sessions over the same weights: the generation graph (LM head on the last position only)
and, built on first use, the scoring graph (every position's logits) that ``model`` exposes with the HF call
convention the fidelity checks use (``model(input_ids=..., use_cache=False).logits``), so a variant's
perplexity and forced top-1 agreement are its own. The K/V cache is a :class:`KVCache`: per-layer buffers
(``OrtValue``s bound as both the graph's past and present, written in place by the attention kernel) and the
number of positions that hold the context; a step writes its positions after them, a cut only lowers the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.clock import Clock

__all__ = ["KVCache", "OrtDecodeRun", "OrtLM", "build_ort_lm", "take"]


@dataclass(frozen=True, slots=True)
class OrtDecodeRun:
    tokens: tuple[int, ...]
    ttft_ns: int  # start -> first token (the prompt's forward)
    decode_ns: int  # first token -> last token
    proposed: int = 0  # speculative: drafted tokens, those kept, verify steps
    accepted: int = 0
    steps: int = 0


class _Logits:
    def __init__(self, logits: Any) -> None:
        self.logits = logits


class _ScoringModel:
    """What ``workloads.gen_fidelity`` calls: ``model(input_ids=ids, use_cache=False).logits`` (torch)."""

    def __init__(self, lm: OrtLM) -> None:
        self._lm = lm

    def __call__(self, input_ids: Any, use_cache: bool = False, **_: Any) -> _Logits:
        import torch

        ids = input_ids.detach().cpu().numpy().astype("int64")
        out = self._lm.full_forward(ids)
        return _Logits(torch.from_numpy(out))


class KVCache:
    """Per-layer K and V buffers [1, Hkv, capacity, D] and ``length``, how many leading positions hold the context.

    ``share`` gives a second cache over the same buffers (a draft model drafting after the target's positions:
    whatever it writes there, the target's next verify overwrites)."""

    def __init__(self, k: list[Any], v: list[Any], length: int = 0, io: dict[int, Any] | None = None) -> None:
        self.k, self.v, self.length = k, v, length
        # IOBindings per session with these buffers bound: shared by every share() of the same buffers, so a
        # draft step does not bind the 2 x layers buffers again after each verify
        self._io: dict[int, Any] = {} if io is None else io

    @property
    def capacity(self) -> int:
        return int(self.k[0].shape()[2])

    def share(self) -> KVCache:
        return KVCache(self.k, self.v, self.length, self._io)

    def grow(self, capacity: int) -> None:
        """New buffers of ``capacity`` positions holding this cache's ``length`` (the old ones stay with any share)."""
        import numpy as np
        import onnxruntime as ort

        def bigger(x: Any) -> Any:
            old = x.numpy()
            new = np.zeros((*old.shape[:2], capacity, old.shape[3]), np.float32)
            new[:, :, : self.length] = old[:, :, : self.length]
            return ort.OrtValue.ortvalue_from_numpy(new)

        self.k, self.v = [bigger(x) for x in self.k], [bigger(x) for x in self.v]
        self._io = {}  # new buffers, new bindings (a share of the old buffers keeps the old ones)


class OrtLM:
    def __init__(self, gen_path: Path, full_path: Path | None, threads: int, layers: int, kv_heads: int,
                 head_dim: int) -> None:  # fmt: skip
        self.gen_path, self.full_path, self.threads = Path(gen_path), full_path, threads
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self._sess = self._session(self.gen_path)
        self._full: Any = None
        self.model = _ScoringModel(self)

    def _session(self, path: Path) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def empty_cache(self, capacity: int = 256) -> KVCache:
        import numpy as np
        import onnxruntime as ort

        shape = (1, self.kv_heads, max(1, capacity), self.head_dim)
        bufs = [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32)) for _ in range(2 * self.layers)]
        return KVCache(bufs[: self.layers], bufs[self.layers :])

    def full_session(self) -> Any:
        if self._full is None:
            if self.full_path is None:
                raise RuntimeError("no scoring graph")
            self._full = self._session(Path(self.full_path))
        return self._full

    def run(self, tokens: Sequence[int], cache: KVCache, every: bool = False) -> Any:
        """One forward of ``tokens`` after the cache's ``length`` positions, written after them in place (the
        length grows by ``len(tokens)``): the logits [S or 1, V] as numpy. ``every``: every position's logits
        (the scoring graph), else the last one's."""
        import numpy as np

        sess = self.full_session() if every else self._sess
        total = cache.length + len(tokens)
        if total > cache.capacity:
            cache.grow(max(total, 2 * cache.capacity))
        io = cache._io.get(id(sess))
        if io is None:
            io = sess.io_binding()
            io.bind_output("logits", "cpu")  # first: output 0 (rebinding below keeps its place)
            for i in range(self.layers):
                for kind, bufs in (("k", cache.k), ("v", cache.v)):
                    io.bind_ortvalue_input(f"past_{kind}.{i}", bufs[i])
                    io.bind_ortvalue_output(f"present_{kind}.{i}", bufs[i])
            cache._io[id(sess)] = io
        io.bind_cpu_input("input_ids", np.asarray([list(tokens)], np.int64))
        io.bind_cpu_input("seqlens_k", np.asarray([total - 1], np.int32))
        io.bind_cpu_input("total_sequence_length", np.asarray(total, np.int32))
        io.bind_output("logits", "cpu")
        sess.run_with_iobinding(io)
        cache.length = total
        return io.get_outputs()[0].numpy()[0]

    @staticmethod
    def cut(cache: KVCache, keep: int) -> None:
        """Keep the cache's first ``keep`` positions (the rest is overwritten by the next step)."""
        cache.length = min(cache.length, keep)

    def full_forward(self, ids: Any) -> Any:
        """Every position's logits [B, S, V] for ``ids`` [B, S] (no past; the graph takes one row at a time)."""
        import numpy as np

        rows = [self.run([int(t) for t in r], self.empty_cache(len(r)), every=True)[None] for r in ids]
        return np.concatenate(rows)

    def generate(self, ids: Sequence[int], n: int, eos: frozenset[int], clock: Clock) -> OrtDecodeRun:
        """Greedy, up to ``n`` tokens, stopping after an ``eos`` token (none: exactly ``n``)."""
        import numpy as np

        cache = self.empty_cache(len(ids) + n + 1)
        ctx, toks = list(ids), list[int]()
        marks = [clock.mark()]
        feed = list(ctx)
        while True:
            logits = self.run(feed, cache)
            done = take([int(np.argmax(logits[-1]))], toks, ctx, eos, n)
            marks.append(clock.mark())
            if done:
                break
            feed = ctx[-1:]
        t = [int(x) for x in clock.resolve(marks)]
        return OrtDecodeRun(tuple(toks), t[1] - t[0], t[-1] - t[1])

    def generate_lookup(
        self, ids: Sequence[int], n: int, eos: frozenset[int], clock: Clock, k: int = 4
    ) -> OrtDecodeRun:
        """Greedy speculative decoding with prompt-lookup drafts (``gen.drafts.lookup``): the drafts ride as a
        causal chunk ``[last, d1 .. dk]`` of one forward of the scoring graph (every position's logits); the
        longest prefix equal to the graph's own greedy choices is kept, plus its next token, and the cache is cut
        back to the kept positions. The tokens are this graph's plain greedy tokens (``generate``), by
        construction; a step without a draft is a plain step."""
        import numpy as np

        from latencylab.gen.drafts import lookup

        cache = self.empty_cache(len(ids) + n + k + 1)
        ctx, toks = list(ids), list[int]()
        marks = [clock.mark()]
        logits = self.run(ctx, cache)
        new = [int(np.argmax(logits[-1]))]
        proposed = accepted = steps = 0
        while not take(new, toks, ctx, eos, n):
            marks.append(clock.mark())
            steps += 1  # every decode forward is a step, drafted or not (as gen/speculative.py counts)
            drafts = lookup(ctx, min(k, n - len(toks) - 1))
            logits = self.run([ctx[-1], *drafts], cache, every=bool(drafts))
            greedy = np.argmax(logits, axis=-1)
            a = 0
            while a < len(drafts) and drafts[a] == int(greedy[a]):
                a += 1
            new = [*drafts[:a], int(greedy[a] if drafts else greedy[-1])]
            proposed, accepted = proposed + len(drafts), accepted + a
            self.cut(cache, len(ctx) + a)  # the rejected drafts' positions leave the cache
        marks.append(clock.mark())
        t = [int(x) for x in clock.resolve(marks)]
        return OrtDecodeRun(tuple(toks), t[1] - t[0], t[-1] - t[1], proposed, accepted, steps)


def take(new: Sequence[int], toks: list[int], ctx: list[int], eos: frozenset[int], n: int) -> bool:
    """Append ``new`` to the reply and the context up to an EOS token or the ``n``-th token; True: the reply ends."""
    for tok in new:
        toks.append(tok)
        ctx.append(tok)
        if tok in eos or len(toks) >= n:
            return True
    return False


def build_ort_lm(model: Any, work: Path, threads: int, quant: dict[str, Any] | None = None,
                 scoring: bool = True) -> OrtLM:  # fmt: skip
    """Export ``model`` under ``work`` (the generation graph and, with ``scoring``, the every-position graph),
    optionally with its MatMuls swapped for MatMulNBits (``quant``: bits, block, accuracy_level), and open it."""
    from latencylab.gen.ort_llama import export_llama, head_dim, quantize_matmuls

    work = Path(work)
    paths: list[Path | None] = []
    for last_only, name in ((True, "gen"), (False, "full")):
        if name == "full" and not scoring:
            paths.append(None)
            continue
        p = export_llama(model, work / f"{name}-fp32.onnx", last_only=last_only)
        if quant:
            q = work / f"{name}-q{quant['bits']}b{quant['block']}.onnx"
            quantize_matmuls(p, q, **quant)
            p.unlink()
            p = q
        paths.append(p)
    cfg = model.config
    assert paths[0] is not None
    return OrtLM(paths[0], paths[1], threads, int(cfg.num_hidden_layers), int(cfg.num_key_value_heads), head_dim(cfg))

"""Greedy decoding of a Llama-family model through ONNX Runtime (the graph of :mod:`latencylab.gen.ort_llama`).

``OrtLM`` holds two sessions over the same weights: the generation graph (LM head on the last position only)
and, built on first use, the scoring graph (every position's logits) that ``model`` exposes with the HF call
convention the fidelity checks use (``model(input_ids=..., use_cache=False).logits``), so a variant's
perplexity and forced top-1 agreement are its own. The K/V cache stays in ORT's memory between steps
(``OrtValue``s bound with IOBinding, never copied to numpy); each step's graph concatenates the new position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.clock import Clock

__all__ = ["OrtDecodeRun", "OrtLM", "build_ort_lm", "take"]


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


class OrtLM:
    def __init__(self, gen_path: Path, full_path: Path | None, threads: int, layers: int, kv_heads: int,
                 head_dim: int) -> None:  # fmt: skip
        self.gen_path, self.full_path, self.threads = Path(gen_path), full_path, threads
        self.kv_shape = (layers, 1, kv_heads, 0, head_dim)
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

    def empty_cache(self) -> tuple[Any, Any]:
        import numpy as np
        import onnxruntime as ort

        empty = np.zeros(self.kv_shape, np.float32)
        return ort.OrtValue.ortvalue_from_numpy(empty), ort.OrtValue.ortvalue_from_numpy(empty)

    def full_session(self) -> Any:
        if self._full is None:
            if self.full_path is None:
                raise RuntimeError("no scoring graph")
            self._full = self._session(Path(self.full_path))
        return self._full

    def run(self, tokens: Sequence[int], pk: Any, pv: Any, every: bool = False) -> tuple[Any, Any, Any]:
        """One forward of ``tokens`` after the cache ``pk``/``pv``: (logits [S or 1, V] as numpy, the grown
        cache). ``every``: every position's logits (the scoring graph), else the last one's."""
        import numpy as np

        sess = self.full_session() if every else self._sess
        io = sess.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([list(tokens)], np.int64))
        io.bind_ortvalue_input("past_k", pk)
        io.bind_ortvalue_input("past_v", pv)
        for name in ("logits", "present_k", "present_v"):
            io.bind_output(name, "cpu")
        sess.run_with_iobinding(io)
        logits, pk, pv = io.get_outputs()
        return logits.numpy()[0], pk, pv

    @staticmethod
    def cut(pk: Any, pv: Any, keep: int) -> tuple[Any, Any]:
        """The cache's first ``keep`` positions (a copy; unchanged when it holds no more)."""
        import numpy as np
        import onnxruntime as ort

        if pk.shape()[3] <= keep:
            return pk, pv
        return tuple(
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x.numpy()[:, :, :, :keep])) for x in (pk, pv)
        )

    def full_forward(self, ids: Any) -> Any:
        """Every position's logits [B, S, V] for ``ids`` [B, S] (no past; the graph takes one row at a time)."""
        import numpy as np

        full = self.full_session()
        empty = np.zeros(self.kv_shape, np.float32)
        rows = [full.run(["logits"], {"input_ids": r[None], "past_k": empty, "past_v": empty})[0] for r in ids]
        return np.concatenate(rows)

    def generate(self, ids: Sequence[int], n: int, eos: frozenset[int], clock: Clock) -> OrtDecodeRun:
        """Greedy, up to ``n`` tokens, stopping after an ``eos`` token (none: exactly ``n``)."""
        import numpy as np

        pk, pv = self.empty_cache()
        ctx, toks = list(ids), list[int]()
        marks = [clock.mark()]
        feed = list(ctx)
        while True:
            logits, pk, pv = self.run(feed, pk, pv)
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

        pk, pv = self.empty_cache()
        ctx, toks = list(ids), list[int]()
        marks = [clock.mark()]
        logits, pk, pv = self.run(ctx, pk, pv)
        new = [int(np.argmax(logits[-1]))]
        proposed = accepted = steps = 0
        while not take(new, toks, ctx, eos, n):
            marks.append(clock.mark())
            steps += 1  # every decode forward is a step, drafted or not (as gen/speculative.py counts)
            drafts = lookup(ctx, min(k, n - len(toks) - 1))
            logits, pk, pv = self.run([ctx[-1], *drafts], pk, pv, every=bool(drafts))
            greedy = np.argmax(logits, axis=-1)
            a = 0
            while a < len(drafts) and drafts[a] == int(greedy[a]):
                a += 1
            new = [*drafts[:a], int(greedy[a] if drafts else greedy[-1])]
            proposed, accepted = proposed + len(drafts), accepted + a
            pk, pv = self.cut(pk, pv, len(ctx) + a)  # the rejected drafts' positions leave the cache
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
    from latencylab.gen.ort_llama import export_llama, quantize_matmuls

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
    hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    assert paths[0] is not None
    return OrtLM(paths[0], paths[1], threads, int(cfg.num_hidden_layers), int(cfg.num_key_value_heads), hd)

"""The ONNX Runtime candidates of the generative search: the model exported as one graph with its K/V cache
(``gen/ort_llama.py``), FP32 or with its MatMuls as ORT's blockwise ``MatMulNBits`` (8 or 4 bits, a scale and
zero point per 32 weights; ``accuracy_level`` 4: activations quantised to INT8 per block in the kernel).

Params: ``{"runtime": "ort", "threads": t, "bits": 0 | 8 | 4, "block": 32, "accuracy_level": 4}`` (bits 0:
FP32); with ``"draft": "lookup", "k": K`` greedy speculative decoding with prompt-lookup drafts verified in the
graph (``OrtLM.generate_lookup``), with ``"draft": "ort-int8"`` the FP32 graph verifies K tokens drafted by its own
blockwise-INT8 copy (``gen/ort_spec.py``): the FP32 graph's own greedy tokens, by construction, either way. The
graphs are written to a temporary directory the runner removes on ``close``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latencylab.optimize.gen_candidates import GenContext, GenRun

__all__ = ["OrtGenRunner", "build_ort", "ort_graphs", "ort_skip"]


def ort_skip(model: Any) -> str | None:
    """Why the ORT candidates cannot run on ``model`` (None: they can)."""
    import importlib.util

    from latencylab.errors import LatencyLabError
    from latencylab.gen.ort_llama import check_llama

    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return "not installed: onnxruntime and onnx (pip install 'latencylab[onnx]')"
    try:
        check_llama(model)
    except LatencyLabError as exc:
        return str(exc)
    return None


class OrtGenRunner:
    """``GenRunner``'s interface over :class:`latencylab.gen.ort_decode.OrtLM`."""

    def __init__(
        self, lm: Any, work: Path, clock: Any, threads: int, lookup_k: int = 0, draft: Any = None, k: int = 4
    ) -> None:
        self.lm, self.work, self.clock, self.threads, self.lookup_k = lm, work, clock, threads, lookup_k
        self.draft, self.k = draft, k  # a draft OrtLM: speculative decoding with a model draft (gen/ort_spec.py)
        self.model = lm.model  # the scoring graph, called as an HF model by the fidelity checks
        self.stats: dict[str, Any] = {}

    def generate(self, ids: Sequence[int], n: int, eos: frozenset[int] = frozenset()) -> GenRun:
        from latencylab.optimize.gen_candidates import GenRun

        if self.draft is not None:
            from latencylab.gen.ort_spec import generate_with_draft

            r = generate_with_draft(self.lm, self.draft, ids, n, eos, self.clock, self.k)
        elif self.lookup_k:
            r = self.lm.generate_lookup(ids, n, eos, self.clock, self.lookup_k)
        else:
            r = self.lm.generate(ids, n, eos, self.clock)
        return GenRun(r.tokens, r.ttft_ns, r.decode_ns, r.proposed, r.accepted, r.steps)

    def live_stats(self) -> dict[str, Any]:
        return dict(self.stats)

    def close(self) -> None:
        self.lm = self.model = self.draft = None
        shutil.rmtree(self.work, ignore_errors=True)


def _quant(params: Mapping[str, Any]) -> dict[str, int] | None:
    bits = int(params.get("bits", 0))
    if not bits:
        return None
    return {"bits": bits, "block": int(params.get("block", 32)), "accuracy_level": int(params.get("accuracy_level", 4))}


def ort_graphs(model: Any, params: Mapping[str, Any], threads: int, work: Path) -> tuple[Any, Any]:
    """Export under ``work`` the graph ``params`` names (FP32, or MatMulNBits with ``bits``) and, with ``"draft":
    "ort-int8"``, its blockwise-INT8 copy (``ort-int8-block32``) as the draft: (target ``OrtLM``, draft or None).
    The search's builder and ``serve --from`` both build through here."""
    from latencylab.errors import LatencyLabError
    from latencylab.gen.ort_decode import OrtLM, build_ort_lm
    from latencylab.gen.ort_llama import quantize_matmuls

    quant, draft = _quant(params), params.get("draft")
    if draft not in (None, "lookup", "ort-int8"):
        raise LatencyLabError(f"ort runtime: draft {draft!r} not supported (known: lookup, ort-int8)")
    if draft == "ort-int8" and quant:
        raise LatencyLabError("ort runtime: an INT8 draft verifies an FP32 target (bits 0)")
    lm = build_ort_lm(model, work, threads, quant)
    if draft != "ort-int8":
        return lm, None
    q = work / "draft-q8b32.onnx"
    quantize_matmuls(lm.gen_path, q, bits=8, block=32, accuracy_level=4)
    return lm, OrtLM(q, None, threads, lm.layers, lm.kv_heads, lm.head_dim)


def build_ort(ctx: GenContext, params: Mapping[str, Any]) -> OrtGenRunner:
    from latencylab.timing import now_ns

    threads = int(params.get("threads", ctx.threads))
    work = Path(tempfile.mkdtemp(prefix="latencylab-ort-"))
    t0 = now_ns(ctx.clock)
    try:
        lm, dlm = ort_graphs(ctx.model, params, threads, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    k = int(params.get("k", 4))
    runner = OrtGenRunner(lm, work, ctx.clock, threads, k if params.get("draft") == "lookup" else 0, dlm, k)
    size = sum(p.stat().st_size for p in work.glob("gen-*.onnx"))
    runner.stats = {"export_s": (now_ns(ctx.clock) - t0) / 1e9, "graph_mb": round(size / 2**20, 1)}
    quant = _quant(params)
    if quant:
        runner.stats["matmul_nbits"] = quant
    return runner

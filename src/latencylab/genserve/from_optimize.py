"""``latencylab serve --model gen --from DIR``: serve the variant ``latencylab optimize --workload gen --out DIR``
chose.

DIR holds ``recipe.json`` (the choice: its candidate, family and the ``params`` that rebuild it, the layers its
search kept in float, the threads it was measured at, what it measured) and ``optimize.json`` (the whole search:
every candidate's TPOT p50/p99 and fidelity). :func:`load_gen_plan` reads and checks both (JSON only: a bad
directory is refused before any model loads); :func:`rebuild` makes the variant from the FP32 model the server
loaded (transformers' safetensors: no pickle is read, nothing but JSON comes from DIR) with the same functions
the search built it with (:func:`latencylab.gen.quant.quantize`, :func:`latencylab.gen.smooth.smooth`):

* INT8 weights (``dynamic``, ``dynamic-perchannel``, ``weight``), with **the layers the recipe records** as
  kept in float (not ranked or screened again: a screen takes minutes of perplexity, and its choice can move
  with the thread count), SmoothQuant folded in first when the recipe has ``smooth`` (its scales calibrated on
  the same corpus lines as in the search, at the recipe's threads: the folded weights' last bits depend on
  the thread count);
* BF16 weights and compute; FP32 at another thread count (``fp32-tN``).

* the ONNX Runtime graph (``ort-*``: FP32 or blockwise INT8/INT4 MatMuls, alone, with prompt lookup or with its
  INT8 draft), re-exported from the FP32 model and served by :class:`~latencylab.genserve.ort_engine.OrtEngine`
  (one sequence a forward: a low-latency engine, its draft-and-verify steps inside the continuous batch).

Refused, with why (one line): speculative decoding over the torch model (a continuous-batching step is one
forward for every running sequence; there is no model draft in it), a KV cache dtype (the engine's shared cache
holds the model's dtype), ``torch.compile`` of the decode step (compiled over a batch-1 static cache, not the engine's
shared batch cache); a recipe of another workload, of another model (the converted model's key), or one whose
kept layers the model does not have.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["GenPlan", "check_ladder", "load_gen_plan", "ort_engine", "rebuild"]

RESERVED = ("int8", "capped", "cache")  # the ladder's other rung names: a candidate cannot take them
_FIDELITY = ("token_agreement", "exact", "top1", "ppl_delta")
_PARAMS = {"weights", "keep", "keep_float", "smooth", "dtype", "kv_dtype", "compile", "threads", "draft", "k",
           "max_len"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GenPlan:
    """What ``serve --model gen --from DIR`` serves: the chosen candidate, how to rebuild it, what it measured."""

    source: Path
    candidate: str
    family: str
    params: Mapping[str, Any]
    keep: tuple[str, ...]  # Linear layers the search kept in float (INT8 variants)
    threads: int  # the threads the search measured it at
    budget: str
    model: Mapping[str, Any]  # the recipe's model: {"model", "key", "dtype"}
    measured: Mapping[str, Any]  # tpot_ms (equal work), tpot_p50_ms, tpot_p99_ms, ttft_p50_ms, speedup_tpot
    fidelity: Mapping[str, Any]  # token_agreement, exact, top1, ppl_delta (against FP32, held-out)
    baseline: Mapping[str, Any] = field(default_factory=dict)  # the FP32 baseline's tpot_p50_ms, tpot_ms
    exact: bool = False  # exact by construction
    created_at: str | None = None
    calibration: int = 8  # corpus lines SmoothQuant's scales were calibrated on

    def describe(self) -> dict[str, Any]:
        """The served variant as ``GET /v1/models`` and the OIP metadata list it (JSON)."""
        return {
            "candidate": self.candidate, "family": self.family, "params": dict(self.params),
            "keep_float_layers": list(self.keep), "from": str(self.source), "budget": self.budget,
            "measured_threads": self.threads, "tpot_p50_ms": self.measured.get("tpot_p50_ms"),
            "tpot_p99_ms": self.measured.get("tpot_p99_ms"), "tpot_ms": self.measured.get("tpot_ms"),
            "speedup_tpot": self.measured.get("speedup_tpot"), "fidelity": dict(self.fidelity),
            "baseline_tpot_p50_ms": self.baseline.get("tpot_p50_ms"), "searched_at": self.created_at,
        }  # fmt: skip

    def line(self) -> str:
        """The startup log's line: which candidate, its measured TPOT p50 and fidelity."""
        m, f = self.measured, self.fidelity
        p50 = m.get("tpot_p50_ms")
        tp = "TPOT p50 n/a" if p50 is None else f"TPOT p50 {p50:.1f} ms"
        sp = m.get("speedup_tpot")
        if sp is not None:
            base = self.baseline.get("tpot_p50_ms")
            tp += f", {sp:.2f}x FP32's TPOT at equal work" + ("" if base is None else f" (FP32 p50 {base:.1f} ms)")
        fid = ", ".join(
            f"{k} {100 * v:+.2f}%" if k == "ppl_delta" else f"{k} {v:.3f}"
            for k in _FIDELITY
            if isinstance(v := f.get(k), int | float)
        )
        keep = f", {len(self.keep)} Linear layers kept in float" if self.keep else ""
        return (
            f"serving {self.candidate} ({self.family}{keep}) from {self.source}: {tp}; {fid or 'fidelity n/a'} "
            f"(budget {self.budget}; measured at {self.threads} thread(s))"
        )


def _read(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable {what} ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise LatencyLabError(f"{path}: not a {what} (a JSON object was expected)")
    return doc


def _ort_unservable(params: Mapping[str, Any]) -> str | None:
    """The ``ort-*`` family: the graph (FP32 or MatMulNBits), alone, with prompt lookup, or with its INT8 draft."""
    unknown = sorted(set(params) - {"runtime", "threads", "bits", "block", "accuracy_level", "draft", "k"})
    if unknown:
        return f"unknown ONNX Runtime params {', '.join(unknown)}"
    if params.get("draft") not in (None, "lookup", "ort-int8"):
        return f"draft {params['draft']!r} (known: lookup, ort-int8)"
    if params.get("draft") == "ort-int8" and int(params.get("bits", 0)):
        return "an INT8 draft verifies an FP32 graph (bits 0)"
    return None


def unservable(params: Mapping[str, Any]) -> str | None:
    """Why the continuous-batching engine cannot serve a variant of ``params`` (None: it can)."""
    from latencylab.gen.quant import METHODS

    if params.get("runtime") == "ort":
        return _ort_unservable(params)
    if params.get("draft"):
        return (
            f"speculative decoding ({params['draft']} draft): the continuous-batching engine runs one forward per "
            "step for every sequence, with no draft and verify"
        )
    if str(params.get("kv_dtype", "fp32")) != "fp32":
        return f"a {params['kv_dtype']} KV cache: the engine's shared batch cache holds the model's dtype"
    if params.get("compile"):
        return (
            "torch.compile of the decode step: it is compiled over a batch-1 static cache, not the engine's shared "
            "batch cache (serve --model gen serves the same FP32 weights eagerly)"
        )
    weights, dtype = str(params.get("weights", "fp32")), str(params.get("dtype", "fp32"))
    if weights != "fp32" and weights not in METHODS:
        return f"weights {weights!r} (known: fp32, {', '.join(METHODS)})"
    if dtype not in ("fp32", "bf16") or (dtype == "bf16" and weights != "fp32"):
        return f"dtype {dtype!r} with weights {weights!r} (known: fp32, or bf16 of FP32 weights)"
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        return f"params {', '.join(unknown)} that this version does not know"
    return None


def load_gen_plan(source: str | Path) -> GenPlan:
    """Read and check an ``optimize --workload gen`` output directory (module docstring); one-line errors."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise LatencyLabError(
            f"{root}: no such directory (give the --out directory of latencylab optimize --workload gen)"
        )
    recipe_path, doc_path = root / "recipe.json", root / "optimize.json"
    doc = _read(doc_path, "optimize result") if doc_path.is_file() else None
    if doc is not None and doc.get("kind") != "optimize-gen":
        raise LatencyLabError(
            f"{doc_path}: not a gen search result (kind {doc.get('kind')!r}, expected 'optimize-gen')"
        )
    if not recipe_path.is_file():
        if doc is not None:
            verdict = (doc.get("summary") or {}).get("verdict") or "no variant chosen"
            raise LatencyLabError(
                f"{root}: the search chose no variant ({verdict}), so it wrote no recipe.json: nothing to serve but "
                "the FP32 model (serve --model gen)"
            )
        raise LatencyLabError(f"{root}: no recipe.json: not an output directory of latencylab optimize --workload gen")
    recipe = _read(recipe_path, "recipe")
    if recipe.get("kind") != "recipe":
        raise LatencyLabError(
            f"{recipe_path}: not a latencylab recipe (kind {recipe.get('kind')!r}, expected 'recipe')"
        )
    if recipe.get("workload") != "gen":
        raise LatencyLabError(
            f"{recipe_path}: a recipe of workload {recipe.get('workload')!r}: serve --model gen --from serves "
            "optimize --workload gen's (serve --from DIR serves text and vision)"
        )
    name, family, params = recipe.get("candidate"), recipe.get("family"), recipe.get("params")
    if not isinstance(name, str) or not name or not isinstance(params, dict) or not isinstance(family, str):
        raise LatencyLabError(f"{recipe_path}: the recipe names no candidate with its params")
    if name in RESERVED:
        raise LatencyLabError(
            f"{recipe_path}: candidate {name!r} takes the name of a ladder rung ({', '.join(RESERVED)})"
        )
    why = unservable(params)
    if why is not None:
        raise LatencyLabError(f"{recipe_path}: {name} cannot be served by serve --model gen: {why}")
    keep_rec = recipe.get("keep_float_layers")
    keeps = params.get("keep") or int(params.get("keep_float", 0) or 0)
    if keeps and not (isinstance(keep_rec, list) and all(isinstance(x, str) for x in keep_rec)):
        raise LatencyLabError(f"{recipe_path}: {name} keeps layers in float but the recipe does not record which")
    cand: Mapping[str, Any] = {}
    baseline: Mapping[str, Any] = {}
    if doc is not None:
        chosen = (doc.get("summary") or {}).get("chosen")
        if chosen != name:
            raise LatencyLabError(
                f"{root}: recipe.json chose {name} but optimize.json chose {chosen}: not the same search"
            )
        by = {c.get("name"): c for c in doc.get("candidates") or [] if isinstance(c, dict)}
        cand = by.get(name) or {}
        if cand and cand.get("params") != params:
            raise LatencyLabError(
                f"{root}: recipe.json's params of {name} differ from optimize.json's: not the same search"
            )
        baseline = by.get((doc.get("summary") or {}).get("baseline")) or {}
    rec = recipe.get("measured") or {}
    fid = cand.get("fidelity") or rec
    measured = {
        "tpot_ms": cand.get("tpot_ms", rec.get("tpot_ms")), "tpot_p50_ms": cand.get("tpot_p50_ms"),
        "tpot_p99_ms": cand.get("tpot_p99_ms"), "ttft_p50_ms": cand.get("ttft_p50_ms", rec.get("ttft_p50_ms")),
        "speedup_tpot": rec.get("speedup_tpot"),
    }  # fmt: skip
    try:
        threads = int(params.get("threads") or recipe.get("threads") or 1)
        calibration = int(recipe.get("calibration", 8))
    except (TypeError, ValueError):
        raise LatencyLabError(f"{recipe_path}: threads or calibration is not a number") from None
    return GenPlan(
        source=root.resolve(), candidate=name, family=family, params=dict(params), keep=tuple(keep_rec or ()),
        threads=threads, budget=str(recipe.get("budget")), model=dict(recipe.get("model") or {}),
        measured=measured, fidelity={k: fid.get(k) for k in _FIDELITY},
        baseline={"tpot_p50_ms": baseline.get("tpot_p50_ms"), "tpot_ms": baseline.get("tpot_ms")},
        exact=bool(recipe.get("exact_by_construction")), created_at=recipe.get("created_at"),
        calibration=calibration,
    )  # fmt: skip


def check_ladder(plan: GenPlan, ladder: Sequence[str]) -> None:
    """A ladder served from a plan starts with the plan's variant (else it would not be served at all)."""
    if not ladder or ladder[0] != plan.candidate:
        raise LatencyLabError(
            f"--from {plan.source}: the ladder must start with the variant the search chose, {plan.candidate} "
            f"(e.g. --ladder {plan.candidate},int8,capped,cache), got {','.join(ladder) or '(none)'}"
        )


def calibration_ids(tokenizer: Any, n: int) -> list[list[int]]:
    """The corpus lines the search calibrated on (:data:`latencylab.optimize.gen_lab.CALIBRATION_START`, the
    first 64 tokens of each), as ``smollm2_subject`` tokenizes them."""
    from latencylab.optimize.gen_lab import CALIBRATION_START
    from latencylab.workloads.text import corpus

    lines = corpus()[CALIBRATION_START : CALIBRATION_START + n]
    return [list(tokenizer(s)["input_ids"][:64]) for s in lines]


def rebuild(
    plan: GenPlan, model: Any, key: str, calibration: Sequence[Sequence[int]] | None = None, tokenizer: Any = None,
    threads: int | None = None,
) -> Any:  # fmt: skip
    """The plan's variant of the FP32 ``model`` (left as it is; ``key``: its converted directory's name, which
    must be the recipe's). ``calibration``: SmoothQuant's text (default: the search's corpus lines, tokenized
    by ``tokenizer``, as many as the recipe's ``calibration``). Run it at the plan's threads; an ``ort-*`` plan
    returns its engine, its ONNX Runtime sessions at ``threads`` (the server's ``--threads``; default the plan's)."""
    want = plan.model.get("key")
    if want != key:
        raise LatencyLabError(
            f"{plan.source}: the recipe was made on model {want!r}, this one is {key!r} (rerun optimize --workload gen)"
        )
    params = plan.params
    if params.get("runtime") == "ort":
        return ort_engine(model, params, threads or plan.threads)
    weights, dtype = str(params.get("weights", "fp32")), str(params.get("dtype", "fp32"))
    if weights != "fp32":
        from latencylab.gen.quant import quantize

        source = model
        sm = params.get("smooth")
        if sm:
            import torch

            from latencylab.gen.smooth import smooth

            if calibration is None:
                calibration = calibration_ids(tokenizer, plan.calibration)
            was = torch.get_num_threads()
            torch.set_num_threads(plan.threads)  # the scales' float sums as the search summed them
            try:
                source = smooth(model, calibration, float(sm.get("alpha", 0.5)), tuple(sm.get("targets", ("down",))))
            finally:
                torch.set_num_threads(was)
        return quantize(source, weights, plan.keep)
    if dtype == "bf16":
        import copy

        import torch

        return copy.deepcopy(model).to(torch.bfloat16).eval()
    return model  # FP32 (at the plan's threads)


def ort_engine(model: Any, params: Mapping[str, Any], threads: int, spec_max_batch: int = 4) -> Any:
    """An :class:`~latencylab.genserve.ort_engine.OrtEngine` of an ``ort-*`` recipe: the graphs exported from the
    FP32 ``model`` to a temporary directory (removed at exit), as ``optimize/gen_ort.build_ort`` builds them."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    from latencylab.genserve.ort_engine import OrtEngine
    from latencylab.optimize.gen_ort import ort_graphs

    work = Path(tempfile.mkdtemp(prefix="latencylab-serve-ort-"))
    atexit.register(shutil.rmtree, work, True)
    lm, draft = ort_graphs(model, params, threads, work)
    if params.get("draft") == "lookup":
        draft = "lookup"
    return OrtEngine(lm, draft, int(params.get("k", 4)), spec_max_batch)

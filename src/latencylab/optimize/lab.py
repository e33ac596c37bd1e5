"""``latencylab optimize``: run the search on a workload, export the winner and its recipe.

The result file holds every candidate (measured, outside the budget, skipped, failed: each with its
reason), the Pareto front, the choice and a documented ``summary``; ``out_dir`` receives the chosen
artifact (an ONNX file, or a TorchScript file for torch variants) and ``recipe.json``, which
``latencylab optimize --recipe`` re-applies to the same model to reproduce the result.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.optimize.search import DEFAULT_BUDGETS, Budget, ProgressFn, SearchResult, search
from latencylab.optimize.types import BuildContext, Candidate
from latencylab.results import SCHEMA_VERSION, utc_now

FAMILIES = {"torch": "latencylab.optimize.families.torch", "onnxruntime": "latencylab.optimize.families.onnxruntime"}


@dataclass(frozen=True, slots=True)
class LabConfig:
    workload: str = "text"
    budget: str | None = None
    threads: int = 1
    time_budget_s: float | None = 600.0
    families: tuple[str, ...] = ("torch", "onnxruntime")
    rounds: int = 10
    per_round: int = 10
    seq_len: int | None = 128
    batch_size: int = 1
    only: tuple[str, ...] = ()  # candidate names to keep (besides the baseline); empty = all
    model_path: str | None = None  # workload "onnx": the user's ONNX file
    inputs_path: str | None = None  # workload "onnx": an .npz of inputs (default: generated)
    pipeline: str | None = None  # workload "pipeline": package.module:function returning a ModelAdapter
    params: tuple[str, ...] = ()  # workload "onnx": key=value workload params (dim.<name>=N, ...)


def _candidates(ctx: BuildContext, families: Sequence[str]) -> list[Candidate]:
    out: list[Candidate] = []
    for fam in families:
        if fam not in FAMILIES:
            raise LatencyLabError(f"unknown candidate family {fam!r}; known: {', '.join(FAMILIES)}")
        module = importlib.import_module(FAMILIES[fam])
        out.extend(module.candidates(ctx))
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise LatencyLabError(f"duplicate candidate names: {sorted(dup)}")
    return out


def _order(cands: list[Candidate], only: Sequence[str]) -> list[Candidate]:
    """The baseline (torch-fp32, else ort-fp32) first; optionally only the named others."""
    base = next((c for c in cands if c.name == "torch-fp32"), None) or next(
        (c for c in cands if c.name == "ort-fp32"), None
    )
    if base is None:
        raise LatencyLabError("no FP32 baseline candidate (torch-fp32 or ort-fp32) is available")
    rest = [c for c in cands if c is not base and (not only or c.name in only)]
    missing = set(only) - {c.name for c in rest}
    if missing:
        raise LatencyLabError(f"unknown candidate(s) {sorted(missing)}")
    return [base, *rest]


def make_context(cfg: LabConfig, workdir: Path) -> BuildContext:
    from latencylab.env import fingerprint
    from latencylab.optimize.adapters import adapter_for

    fp = fingerprint(sample_s=0.0)
    isa = frozenset(fp.get("cpu", {}).get("isa") or ())
    adapter = adapter_for(
        cfg.workload,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        model_path=cfg.model_path,
        inputs_path=cfg.inputs_path,
        pipeline=cfg.pipeline,
        params=dict(p.partition("=")[::2] for p in cfg.params),
    )
    return BuildContext(adapter, workdir, threads=cfg.threads, isa=isa)


def summary_of(res: SearchResult) -> dict[str, Any]:
    base = res.by_name(res.baseline).to_dict()
    out: dict[str, Any] = {
        "budget": res.budget,
        "verdict": res.verdict,
        "baseline": _brief(base),
        "chosen": None,
        "speedup_p50": None,
        "pareto": list(res.pareto),
        "counts": {
            s: sum(1 for c in res.candidates if c.status == s)
            for s in ("inside-budget", "outside-budget", "skipped", "failed")
        },
    }
    if res.chosen is not None:
        ch = res.by_name(res.chosen).to_dict(base.get("p50_ms", 0) * 1e6)
        out["chosen"] = _brief(ch)
        out["speedup_p50"] = base["p50_ms"] / ch["p50_ms"]
    return out


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    f = d.get("fidelity") or {}
    return {
        "name": d["name"],
        "backend": d["backend"],
        "p50_ms": d.get("p50_ms"),
        "p99_ms": d.get("p99_ms"),
        "p50_ci_ms": d.get("p50_ci_ms"),
        "cos_mean": f.get("cos_mean"),
        "cos_min": f.get("cos_min"),
        "top1": f.get("top1"),
        "accuracy": f.get("accuracy"),
    }


def result_dict(cfg: LabConfig, ctx: BuildContext, res: SearchResult, env: dict[str, Any]) -> dict[str, Any]:
    base_p50 = res.by_name(res.baseline).to_dict().get("p50_ms")
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "optimize",
        "created_at": utc_now(),
        "summary": summary_of(res),
        "config": _cfg(cfg),
        "model": ctx.adapter.describe(),
        "wall_s": res.wall_s,
        "candidates": [c.to_dict(base_p50 * 1e6 if base_p50 else None) for c in res.candidates],
        "env": env,
    }


def _cfg(cfg: LabConfig) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


def export(ctx: BuildContext, cand: Candidate, out_dir: Path) -> Path:
    """Write the chosen variant's artifact: its ONNX file, or TorchScript for torch variants."""
    runner = cand.build(ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = getattr(runner, "model_path", None)
    if path is not None:
        dst = out_dir / "model.onnx"
        shutil.copyfile(path, dst)
        return dst
    module = getattr(runner, "module", None) or getattr(runner, "model", None)
    # a torch.compile'd module: export the module it wraps (compilation is a runtime step, in the recipe)
    module = getattr(module, "_orig_mod", module)
    if module is None:
        raise LatencyLabError(f"{cand.name}: the runner exposes neither model_path nor module: cannot export")
    import torch

    feed = ctx.adapter.heldout()[0]
    args = tuple(torch.from_numpy(feed[n]) for n in ctx.adapter.input_names)
    dst = out_dir / "model.pt"
    with torch.inference_mode():
        traced = torch.jit.trace(module, args, strict=False, check_trace=False)
    traced.save(str(dst))
    return dst


def run_lab(
    cfg: LabConfig, out_dir: Path | None = None, progress: ProgressFn | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    """The whole lab: candidates, search, export + recipe; returns the result document."""
    from latencylab.env import fingerprint

    env = fingerprint(sample_s=0.1, probe_torch=True)
    tmp = Path(tempfile.mkdtemp(prefix="latencylab-opt-")) if workdir is None else workdir
    ctx = make_context(cfg, tmp)
    _set_threads(cfg.threads)
    families = cfg.families
    if not getattr(ctx.adapter, "has_torch", True):  # e.g. an ONNX file: nothing for the torch family to transform
        families = tuple(f for f in families if f != "torch") or ("onnxruntime",)
    cands = _order(_candidates(ctx, families), cfg.only)
    budget = Budget.parse(cfg.budget or DEFAULT_BUDGETS[ctx.adapter.output_kind])
    res = search(ctx, cands, budget, cfg.rounds, cfg.per_round, time_budget_s=cfg.time_budget_s, progress=progress)
    doc = result_dict(cfg, ctx, res, env)
    if out_dir is not None and res.chosen is not None:
        chosen = next(c for c in cands if c.name == res.chosen)
        try:
            artifact = export(ctx, chosen, out_dir)
            doc["artifact"] = str(artifact)
        except Exception as exc:
            doc["artifact_error"] = f"{chosen.name}: export failed: {type(exc).__name__}: {exc}"
            artifact = None
        recipe = {
            "schema_version": SCHEMA_VERSION,
            "kind": "recipe",
            "workload": cfg.workload,
            "pipeline": cfg.pipeline,
            "model": ctx.adapter.describe(),
            "candidate": chosen.name,
            "family": chosen.family,
            "backend": chosen.backend,
            "params": dict(chosen.params),
            "threads": cfg.threads,
            "budget": budget.text,
            "measured": doc["summary"]["chosen"],
            "baseline": doc["summary"]["baseline"],
            "artifact": None if artifact is None else artifact.name,
            "created_at": utc_now(),
        }
        (out_dir / "recipe.json").write_text(json.dumps(recipe, indent=1))
        doc["recipe"] = str(out_dir / "recipe.json")
    return doc


def apply_recipe(path: Path, progress: ProgressFn | None = None, rounds: int = 10) -> dict[str, Any]:
    """Rebuild the recipe's variant on the same model and measure it against the baseline again."""
    try:
        recipe = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable recipe ({exc.__class__.__name__})") from exc
    if recipe.get("kind") != "recipe":
        raise LatencyLabError(f"{path}: not a latencylab recipe")
    model = recipe.get("model", {})
    cfg = LabConfig(
        workload=recipe["workload"],
        budget=recipe["budget"],
        threads=int(recipe["threads"]),
        families=(_family_of(recipe["backend"]),) if recipe["backend"] != "torch" else ("torch",),
        seq_len=model.get("seq_len", 128),
        batch_size=int(model.get("batch_size", 1)),
        model_path=model.get("model_path"),
        inputs_path=model.get("inputs_path"),
        pipeline=recipe.get("pipeline"),
        only=(recipe["candidate"],),
        rounds=rounds,
    )
    if cfg.families != ("torch",) and cfg.workload != "onnx":  # the baseline (torch-fp32): the torch family
        cfg = dataclasses.replace(cfg, families=("torch", *cfg.families))
    tmp = Path(tempfile.mkdtemp(prefix="latencylab-recipe-"))
    ctx = make_context(cfg, tmp)
    _set_threads(cfg.threads)
    cands = _order(_candidates(ctx, cfg.families), cfg.only)
    target = cands[-1]
    if dict(target.params) != recipe["params"]:
        raise LatencyLabError(
            f"{path}: candidate {target.name} now has params {dict(target.params)}, the recipe has {recipe['params']}"
        )
    budget = Budget.parse(cfg.budget or "cos>=0")
    res = search(ctx, cands, budget, cfg.rounds, cfg.per_round, time_budget_s=None, progress=progress)
    from latencylab.env import fingerprint

    doc = result_dict(cfg, ctx, res, fingerprint(sample_s=0.0))
    doc["recipe"] = {"path": str(path), "recorded": recipe.get("measured"), "reproduced": _brief(
        res.by_name(target.name).to_dict())}  # fmt: skip
    return doc


def _family_of(backend: str) -> str:
    return "onnxruntime" if backend == "onnxruntime" else "torch"


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)

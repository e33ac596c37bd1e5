"""``latencylab optimize``: run the search on a workload, export the winner and its recipe.

The result file holds every candidate (measured, outside the budget, skipped, failed: each with its
reason), the Pareto front, the choice and a documented ``summary``; ``out_dir`` receives the chosen
artifact (an ONNX file, or a TorchScript file for torch variants) and ``recipe.json``, which
``latencylab optimize --recipe`` re-applies to the same model to reproduce the result.

The result document and its summary are built in :mod:`.lab_summary`; the files (artifact, rungs, the
checks on ``--out`` and on a recipe's sources) are written and checked in :mod:`.lab_export`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.optimize.lab_export import (
    check_sources,
    check_writable,
    clear_previous,
    export,
    export_rungs,
    previous_artifacts,
)
from latencylab.optimize.lab_summary import brief, default_budget, input_lines, result_dict, twin_name
from latencylab.optimize.search import (
    Budget,
    ProgressFn,
    search,
)
from latencylab.optimize.shapes import AS_GIVEN
from latencylab.optimize.types import BuildContext, Candidate
from latencylab.results import kind_version
from latencylab.results.base import utc_now

FAMILIES = {
    "torch": "latencylab.optimize.families.torch",
    "onnxruntime": "latencylab.optimize.families.onnxruntime",
    "openvino": "latencylab.optimize.families.openvino",  # opt-in (--families): pip install 'latencylab[openvino]'
    "tvm": "latencylab.optimize.families.tvm",  # opt-in (--families): pip install 'latencylab[tvm]'
}


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
    tune_time_s: float = 0.0  # --tune-time: TVM MetaSchedule tuning seconds (0: off; families/tvm_tune.py)
    tvm_fuse_depth: int | None = None  # --tvm-fuse-depth: TVM recipes' FuseOps depth (None: TVM's default)
    tvm_fast_math: bool = False  # --tvm-fast-math: TVM recipes' approximate erf/exp/tanh/softmax
    ray: str | None = None  # --ray [ADDRESS]: builds and fidelity runs on Ray workers (scaleout/optimize_ray.py)
    workers: int = 2  # --workers with --ray: build actors (--threads Ray CPUs each)


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


# The build order under a time cap: what won on this kind of model and machine first (docs/BENCHMARKS.md:
# per-channel dynamic INT8 with a small sensitivity fallback, the fused graph, plain ORT), the peers' recipes
# next, then the rest, the slow builds (entropy/percentile calibration, torch.compile) last, so that a cap
# cuts the least promising candidates. Each pattern is a name prefix; unmatched names keep their family order.
PRIORITY = (
    "ort-int8-dynamic-perchannel-fallback-k2",
    "ort-int8-dynamic-perchannel-fallback-k4",
    "ort-int8-dynamic-perchannel",
    "ort-int8-dynamic-fused-perchannel",
    "ort-fp32",
    "route-ort-ov-int8",  # with --families ...,openvino: the length-routed pairs of the INT8 recipes above
    "ort-int8-dynamic-default",
    "torch-int8-dynamic",
    "ort-int8-dynamic-fused",
    "ort-int8-dynamic-u8u8",
    "ort-int8-dynamic-fallback",
    "ort-int8-dynamic",
    "torch-bf16",
    "torch-fuse",
    "torch-prune",
    "ort-int8-static-minmax",
    "ort-int8-static",
    "torch-compile",
)


def _priority(c: Candidate) -> int:
    for i, prefix in enumerate(PRIORITY):
        if c.name == prefix or c.name.startswith(prefix + "-"):
            return i
    return len(PRIORITY)


def _order(cands: list[Candidate], only: Sequence[str]) -> list[Candidate]:
    """The baseline (torch-fp32, else ort-fp32) first, then its shape-policy twins (never cut by the time
    cap), then the others by :data:`PRIORITY`; optionally only the named others."""
    base = next((c for c in cands if c.name == "torch-fp32"), None) or next(
        (c for c in cands if c.name == "ort-fp32"), None
    )
    if base is None:
        raise LatencyLabError("no FP32 baseline candidate (torch-fp32 or ort-fp32) is available")
    rest = [c for c in cands if c is not base and (not only or c.name in only)]
    missing = set(only) - {c.name for c in rest}
    if missing:
        raise LatencyLabError(f"unknown candidate(s) {sorted(missing)}")
    policies = {c.input_policy for c in rest} - {AS_GIVEN}
    twins = [c for p in sorted(policies) for c in cands if c.name == twin_name(base.name, p)]
    rest = sorted((c for c in rest if c not in twins), key=_priority)
    return [base, *twins, *rest]


def lab_candidates(ctx: BuildContext, cfg: LabConfig) -> list[Candidate]:
    """The search's candidates for ``cfg`` in search order (the baseline first): the families that apply to
    the model (an ONNX file has nothing for the torch family), ``cfg.only`` kept."""
    families = cfg.families
    if not getattr(ctx.adapter, "has_torch", True):  # e.g. an ONNX file: nothing for the torch family to transform
        families = tuple(f for f in families if f != "torch") or ("onnxruntime",)
    return _order(_candidates(ctx, families), cfg.only)


def prepare_context(ctx: BuildContext, cfg: LabConfig, budget: Budget) -> None:
    """What every process that builds candidates sets before the first build: the budget (OpenVINO's accuracy
    control reads it), TVM's tuning time, the torch threads."""
    ctx.cache["budget"] = budget.text
    ctx.cache["tune_time_s"] = cfg.tune_time_s
    ctx.cache["tvm_fuse_depth"] = cfg.tvm_fuse_depth
    ctx.cache["tvm_fast_math"] = cfg.tvm_fast_math
    _set_threads(cfg.threads)


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
        workdir=workdir,
    )
    return BuildContext(adapter, workdir, threads=cfg.threads, isa=isa)


def run_lab(
    cfg: LabConfig,
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
    workdir: Path | None = None,
    notice: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The whole lab: candidates, search, export + recipe; returns the result document.

    Everything that can be refused is refused before the search: the budget (:meth:`Budget.parse`, then
    :meth:`Budget.check_applies` once the model is known), ``out_dir`` (writable, and holding no files
    latencylab did not write). The scratch directory (``workdir``, default a fresh ``latencylab-opt-*`` in
    the system temp dir) is removed at the end whatever happens, Ctrl-C included, when run_lab made it.
    ``notice`` receives lines worth printing before the search starts (the inputs and their guesses).
    """
    budget = None if cfg.budget is None else Budget.parse(cfg.budget)
    stale: list[Path] = []
    if out_dir is not None:
        check_writable(out_dir, "--out", is_dir=True)
        stale = previous_artifacts(out_dir, keep=(cfg.model_path, cfg.inputs_path))
        out_dir = Path(out_dir).expanduser().resolve()  # the result names its files wherever it is read from
    from latencylab.env import fingerprint

    env = fingerprint(sample_s=0.1, probe_torch=True)
    own = workdir is None
    tmp = Path(tempfile.mkdtemp(prefix="latencylab-opt-")) if workdir is None else workdir
    try:
        return _run_lab(cfg, tmp, budget, env, out_dir, stale, progress, notice)
    finally:
        if own:
            shutil.rmtree(tmp, ignore_errors=True)


def _run_lab(
    cfg: LabConfig,
    tmp: Path,
    budget: Budget | None,
    env: dict[str, Any],
    out_dir: Path | None,
    stale: list[Path],
    progress: ProgressFn | None,
    notice: Callable[[str], None] | None,
) -> dict[str, Any]:
    ctx = make_context(cfg, tmp)
    described = ctx.adapter.describe()
    if notice is not None:
        for line in input_lines(described, cfg.seq_len):
            notice(line)
    budget = budget or Budget.parse(default_budget(ctx.adapter))
    budget.check_applies(ctx.adapter.labels() is not None, f"{ctx.adapter.name} ({described.get('model')})")
    prepare_context(ctx, cfg, budget)
    cands = lab_candidates(ctx, cfg)
    keep = [c.name for c in cands[1:] if c.name.startswith(cands[0].name + "-")]  # the baseline's twins
    distributed = None
    if cfg.ray is not None:
        from latencylab.scaleout.optimize_ray import search_on_ray  # imports ray only here

        res, distributed = search_on_ray(ctx, cfg, cands, budget, keep=keep, progress=progress)
    else:
        res = search(
            ctx, cands, budget, cfg.rounds, cfg.per_round, time_budget_s=cfg.time_budget_s, progress=progress,
            keep=keep,
        )  # fmt: skip
    doc = result_dict(cfg, ctx, res, env)
    if distributed is not None:
        doc["summary"]["distributed"] = distributed
    if out_dir is None:
        return doc
    out_dir.mkdir(parents=True, exist_ok=True)
    doc["out_removed"] = clear_previous(out_dir, stale)
    if res.chosen is not None:
        chosen = next(c for c in cands if c.name == res.chosen)
        try:
            artifact = export(ctx, chosen, out_dir)
            doc["artifact"] = str(artifact)
        except Exception as exc:
            doc["artifact_error"] = f"{chosen.name}: export failed: {type(exc).__name__}: {exc}"
            artifact = None
        recipe = {
            "schema_version": kind_version("recipe"),
            "kind": "recipe",
            "workload": cfg.workload,
            "pipeline": cfg.pipeline,
            "model": described,
            "candidate": chosen.name,
            "family": chosen.family,
            "backend": chosen.backend,
            "params": dict(chosen.params),
            "threads": cfg.threads,
            "budget": budget.text,
            "measured": doc["summary"]["chosen"],
            "baseline": doc["summary"]["baseline"],
            "baseline_inputs": doc["summary"]["baseline_inputs"],
            "input_policy": chosen.input_policy,
            "speedup": doc["summary"]["speedup"],
            "pipeline_speedup": doc["summary"]["pipeline_speedup"],
            "total_speedup": doc["summary"]["total_speedup"],
            "speedup_by_set": doc["summary"]["speedup_by_set"],
            "headline": doc["summary"]["verdict"],
            "artifact": None if artifact is None else artifact.name,
            "rungs": export_rungs(ctx, cands, res, out_dir),
            "created_at": utc_now(),
        }
        (out_dir / "recipe.json").write_text(json.dumps(recipe, indent=1))
        doc["recipe"] = str(out_dir / "recipe.json")
    # the whole result, also when nothing was chosen: the directory describes this search, not an older one
    (out_dir / "optimize.json").write_text(json.dumps(doc, indent=1, default=str))
    return doc


def apply_recipe(
    path: Path, progress: ProgressFn | None = None, rounds: int = 10, force: bool = False
) -> dict[str, Any]:
    """Rebuild the recipe's variant on the same model and measure it against the baseline again.

    A user's model and inputs must be the ones the recipe records (same sha256; ``force`` rebuilds anyway
    and says so in ``doc["recipe"]["forced"]``); paths are absolute, so the recipe works from any directory.
    """
    try:
        recipe = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable recipe ({exc.__class__.__name__})") from exc
    if recipe.get("kind") != "recipe":
        raise LatencyLabError(f"{path}: not a latencylab recipe")
    model = recipe.get("model", {})
    forced = check_sources(Path(path), model, force)
    if recipe["workload"] == "onnx":
        params: tuple[str, ...] = tuple(f"{k}={v}" for k, v in (model.get("params") or {}).items())
    else:
        params = (f"padding={model['padding']}",) if model.get("padding") else ()
    cfg = LabConfig(
        workload=recipe["workload"],
        budget=recipe["budget"],
        threads=int(recipe["threads"]),
        families=(_family_of(recipe["backend"]),) if recipe["backend"] != "torch" else ("torch",),
        seq_len=model.get("seq_len", 128),
        batch_size=int(model.get("batch_size", 1)),
        params=params,
        model_path=model.get("model_path"),
        inputs_path=model.get("inputs_path"),
        pipeline=recipe.get("pipeline"),
        only=(recipe["candidate"], *_twins(recipe)),
        rounds=rounds,
        tune_time_s=float(recipe["params"].get("tune_time_s") or 0),  # TVM's knobs, as the recipe was made
        tvm_fuse_depth=recipe["params"].get("fuse_max_depth"),
        tvm_fast_math=bool(recipe["params"].get("fast_math")),
    )
    if cfg.families != ("torch",) and cfg.workload != "onnx":  # the baseline (torch-fp32): the torch family
        cfg = dataclasses.replace(cfg, families=("torch", *cfg.families))
    tmp = Path(tempfile.mkdtemp(prefix="latencylab-recipe-"))
    try:
        doc = _reapply(cfg, recipe, tmp, Path(path), progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["recipe"]["forced"] = forced
    return doc


def _reapply(
    cfg: LabConfig, recipe: dict[str, Any], tmp: Path, path: Path, progress: ProgressFn | None
) -> dict[str, Any]:
    ctx = make_context(cfg, tmp)
    _set_threads(cfg.threads)
    cands = _order(_candidates(ctx, cfg.families), cfg.only)
    target = next(c for c in cands if c.name == recipe["candidate"])
    if dict(target.params) != recipe["params"]:
        raise LatencyLabError(
            f"{path}: candidate {target.name} now has params {dict(target.params)}, the recipe has {recipe['params']}"
        )
    budget = Budget.parse(cfg.budget or "cos>=0")
    res = search(ctx, cands, budget, cfg.rounds, cfg.per_round, time_budget_s=None, progress=progress)
    from latencylab.env import fingerprint

    doc = result_dict(cfg, ctx, res, fingerprint(sample_s=0.0))
    doc["recipe"] = {"path": str(path), "recorded": recipe.get("measured"), "reproduced": brief(
        res.by_name(target.name).to_dict())}  # fmt: skip
    return doc


def _twins(recipe: dict[str, Any]) -> tuple[str, ...]:
    """The baseline's twin under the recipe's shape policy (the equal-work reference), if any."""
    policy = recipe.get("input_policy") or AS_GIVEN
    base = (recipe.get("baseline") or {}).get("name") or "torch-fp32"
    return () if policy == AS_GIVEN or recipe["candidate"] == twin_name(base, policy) else (twin_name(base, policy),)


def _family_of(backend: str) -> str:
    if backend == "routed":  # the length-routed ONNX Runtime / OpenVINO pairs: listed by the openvino family
        return "openvino"
    return backend if backend in FAMILIES else "torch"  # torch-compile etc. are the torch family's


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)

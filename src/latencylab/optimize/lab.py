"""``latencylab optimize``: run the search on a workload, export the winner and its recipe.

The result file holds every candidate (measured, outside the budget, skipped, failed: each with its
reason), the Pareto front, the choice and a documented ``summary``; ``out_dir`` receives the chosen
artifact (an ONNX file, or a TorchScript file for torch variants) and ``recipe.json``, which
``latencylab optimize --recipe`` re-applies to the same model to reproduce the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.optimize.search import (
    DEFAULT_BUDGET_NO_LABELS,
    DEFAULT_BUDGETS,
    TIME_CAP_REASON,
    Budget,
    ProgressFn,
    SearchResult,
    search,
)
from latencylab.optimize.shapes import AS_GIVEN
from latencylab.optimize.types import BuildContext, Candidate
from latencylab.results import kind_version, utc_now
from latencylab.results.optimize import OptimizeResult

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


def twin_name(baseline: str, policy: str) -> str:
    """The baseline model under another shape policy (e.g. ``torch-fp32-exact``): the reference of the
    equal-work split when the choice changes the inputs."""
    return baseline if policy == AS_GIVEN else f"{baseline}-{policy}"


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


def _p50(res: SearchResult, name: str, set_name: str) -> float | None:
    try:
        m = res.by_name(name).on_set(set_name)
    except KeyError:
        return None
    return None if m is None else m.p50_ns()


def speedup_split(res: SearchResult, name: str) -> dict[str, Any]:
    """The split of one candidate's gain over the baseline, per input set (docs/metrics.md):

    * ``speedup``: equal work, the baseline model run on the same inputs as the candidate (for a shape
      policy other than as-given, the baseline's twin under that policy, e.g. ``torch-fp32-exact``);
    * ``pipeline_speedup``: what the shape policy alone gained on the baseline model (twin vs baseline),
      None when the candidate runs the inputs as given;
    * ``total_speedup``: the baseline as declared over the candidate = speedup x pipeline_speedup.
    """
    cand = res.by_name(name)
    policy = cand.input_policy
    twin = twin_name(res.baseline, policy)
    out: dict[str, Any] = {"input_policy": policy, "equal_work_reference": twin, "by_set": {}}
    for set_name in res.sets:
        base, ref, mine = (_p50(res, n, set_name) for n in (res.baseline, twin, name))
        entry: dict[str, float | None] = {"speedup": None, "pipeline_speedup": None, "total_speedup": None}
        if base and mine:
            entry["total_speedup"] = base / mine
        if ref and mine:
            entry["speedup"] = ref / mine
        if policy != AS_GIVEN and base and ref:
            entry["pipeline_speedup"] = base / ref
        out["by_set"][set_name] = entry
    return out


def baseline_inputs(doc_model: dict[str, Any], threads: int, baseline: str) -> str:
    """One line: what the baseline runs (model, batch, shapes per input set, threads)."""
    sets = doc_model.get("input_sets") or {}
    shapes_txt = "; ".join(
        f"{n}: {v['feeds']} inputs, mean {v['mean_tokens']:.0f} tokens"
        + ("" if v.get("mean_positions") == v.get("mean_tokens") else f" padded to {v['mean_positions']:.0f}")
        for n, v in sets.items()
    )
    pad = f", padding={doc_model['padding']}" if doc_model.get("padding") else ""
    return (
        f"{baseline} at batch {doc_model.get('batch_size', 1)}, {threads} thread{'s' if threads != 1 else ''}{pad}"
        + (f" ({shapes_txt})" if shapes_txt else "")
    )


def summary_of(res: SearchResult, model: dict[str, Any] | None = None, threads: int = 1) -> dict[str, Any]:
    base = res.by_name(res.baseline).to_dict()
    out: dict[str, Any] = {
        "budget": res.budget,
        "verdict": res.verdict,
        "baseline": _brief(base),
        "baseline_inputs": baseline_inputs(model or {}, threads, res.baseline),
        "input_sets": list(res.sets),
        "chosen": None,
        "speedup": None,
        "pipeline_speedup": None,
        "total_speedup": None,
        "speedup_by_set": {},
        "pipeline_speedup_by_set": {},
        "pareto": list(res.pareto),
        "counts": {
            s: sum(1 for c in res.candidates if c.status == s)
            for s in ("inside-budget", "outside-budget", "skipped", "failed")
        },
        "skipped_by_time_cap": [c.name for c in res.candidates if c.reason == TIME_CAP_REASON],
    }
    if res.chosen is not None:
        ch = res.by_name(res.chosen).to_dict(base.get("p50_ms", 0) * 1e6)
        out["chosen"] = _brief(ch)
        split = speedup_split(res, res.chosen)
        primary = split["by_set"][res.sets[0]]
        out.update(
            speedup=primary["speedup"],
            pipeline_speedup=primary["pipeline_speedup"],
            total_speedup=primary["total_speedup"],
            speedup_by_set={k: v["speedup"] for k, v in split["by_set"].items()},
            pipeline_speedup_by_set={k: v["pipeline_speedup"] for k, v in split["by_set"].items()},
            input_policy=split["input_policy"],
            equal_work_reference=split["equal_work_reference"],
        )
        out["verdict"] = headline(out)
    return out


def headline(s: dict[str, Any]) -> str:
    """The one line the terminal, the recipe and the report print: the equal-work speedup per input set,
    and the pipeline change's gain apart."""
    ch = (s.get("chosen") or {}).get("name")
    if not ch:
        return str(s.get("verdict", ""))
    by_set = s.get("speedup_by_set") or {}
    parts = ", ".join(f"{v:.2f}x on {k}" for k, v in by_set.items() if v)
    base = (s.get("baseline") or {}).get("name", "the baseline")
    line = f"{ch}: faster (p50) than {base} at equal work (same inputs) by {parts or '?'}, inside {s.get('budget')}"
    pipe = s.get("pipeline_speedup_by_set") or {}
    if any(pipe.values()):
        gains = ", ".join(f"{v:.2f}x on {k}" for k, v in pipe.items() if v)
        policy = s.get("input_policy")
        line += f"; the pipeline change (shape policy '{policy}') gains {gains} more on the declared inputs"
    return line


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
    base = res.by_name(res.baseline)
    base_p50 = base.to_dict().get("p50_ms")
    base_sets = {m.name: p for m in base.sets if (p := m.p50_ns())}
    model = ctx.adapter.describe()
    return OptimizeResult.build(
        summary=summary_of(res, model, cfg.threads),
        config=_cfg(cfg),
        model=model,
        wall_s=res.wall_s,
        candidates=[c.to_dict(base_p50 * 1e6 if base_p50 else None, base_sets) for c in res.candidates],
        env=env,
    ).to_dict()


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


def check_writable(path: str | Path, what: str, is_dir: bool) -> None:
    """Raise a one-line error now, before any work, unless ``path`` can be written later (a directory for
    ``is_dir``, else a file); missing parents count as creatable when the nearest existing one is a writable
    directory. Creates nothing."""
    p = Path(path).expanduser()
    if p.exists():
        if is_dir and not p.is_dir():
            raise LatencyLabError(f"{what} {path} is a file, not a directory")
        if not is_dir and p.is_dir():
            raise LatencyLabError(f"{what} {path} is a directory, not a file")
        if not os.access(p, os.W_OK | (os.X_OK if is_dir else 0)):
            raise LatencyLabError(f"{what} {path} is not writable")
        return
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise LatencyLabError(f"{what} {path} cannot be created: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LatencyLabError(f"{what} {path} cannot be created: {parent} is not writable")


OUT_FILES = ("model.onnx", "model.pt", "recipe.json", "optimize.json")  # what run_lab writes into --out
RUNGS_DIR = "rungs"  # and rungs/<candidate>.onnx


def _kind_of(path: Path) -> str | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc.get("kind") if isinstance(doc, dict) else None


def previous_artifacts(out_dir: Path, keep: Sequence[str | None] = ()) -> list[Path]:
    """The files an earlier run wrote into ``out_dir`` (:data:`OUT_FILES`, ``rungs/*.onnx``): this run removes
    them before it writes its own, so no artifact is left beside a result it does not belong to.

    Refuses (one line) when those names are there without a latencylab ``recipe.json`` or ``optimize.json``
    (they would be a user's files), and when one of them, or ``out_dir`` itself, is in ``keep`` (the run's
    ``--model`` / ``--inputs``). Other files are never touched.
    """
    out_dir = Path(out_dir).expanduser()
    protected = {Path(k).expanduser().resolve() for k in keep if k}
    if out_dir.resolve() in protected:
        raise LatencyLabError(f"--out {out_dir} is the --model directory: give another --out")
    if not out_dir.is_dir():
        return []
    found = [out_dir / n for n in OUT_FILES if (out_dir / n).is_file()]
    if (out_dir / RUNGS_DIR).is_dir():
        found += sorted(p for p in (out_dir / RUNGS_DIR).glob("*.onnx") if p.is_file())
    if not found:
        return []
    names = ", ".join(str(p.relative_to(out_dir)) for p in found)
    if _kind_of(out_dir / "recipe.json") != "recipe" and _kind_of(out_dir / "optimize.json") != "optimize":
        raise LatencyLabError(
            f"--out {out_dir} holds {names}, which latencylab did not write (no latencylab recipe.json or "
            "optimize.json beside them): give another --out, or move them away"
        )
    for p in found:
        if p.resolve() in protected:
            raise LatencyLabError(f"--out {out_dir} would replace {p.relative_to(out_dir)}, this run's input: "
                                  "give another --out")  # fmt: skip
    return found


def clear_previous(out_dir: Path, stale: Sequence[Path]) -> list[str]:
    """Remove ``stale`` (from :func:`previous_artifacts`) and an emptied ``rungs/``; the names removed."""
    removed = []
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(str(p.relative_to(out_dir)))
    rungs = out_dir / RUNGS_DIR
    with contextlib.suppress(OSError):  # not empty (a user's file in it) or absent: left as it is
        rungs.rmdir()
    return removed


def default_budget(adapter: Any) -> str:
    """The budget when none is given: by output kind; a classifier without labels by top-1 agreement."""
    table = DEFAULT_BUDGETS if adapter.labels() is not None else DEFAULT_BUDGET_NO_LABELS
    return table[adapter.output_kind]


def input_lines(model: dict[str, Any], seq_len: int | None = None) -> list[str]:
    """Where the inputs come from, how they were split, and every guess made (the terminal prints these)."""
    out = [str(model["inputs_line"])] if model.get("inputs_line") else []
    for g in model.get("guessed_inputs") or []:
        out.append(f"  guessed {g['name']} {g['dtype']} {g['shape']}: {g['values']}")
    dims = model.get("guessed_dims") or {}
    if dims:
        given = "dim" in (model.get("params") or {})
        src = "--param dim=N" if given else "--seq-len" if seq_len else "the default guess"
        sizes = ", ".join(f"{k}={v}" for k, v in dims.items())
        fix = " ".join(f"--param dim.{k}=N" for k in dims)
        out.append(
            f"  guessed dimension(s) {sizes} (from {src}; {fix} to choose, or --inputs FILE.npz for real inputs)"
        )
    return out


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
    _set_threads(cfg.threads)
    families = cfg.families
    if not getattr(ctx.adapter, "has_torch", True):  # e.g. an ONNX file: nothing for the torch family to transform
        families = tuple(f for f in families if f != "torch") or ("onnxruntime",)
    cands = _order(_candidates(ctx, families), cfg.only)
    keep = [c.name for c in cands[1:] if c.name.startswith(cands[0].name + "-")]  # the baseline's twins
    res = search(
        ctx, cands, budget, cfg.rounds, cfg.per_round, time_budget_s=cfg.time_budget_s, progress=progress, keep=keep
    )
    doc = result_dict(cfg, ctx, res, env)
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


def rung_candidates(res: SearchResult) -> list[str]:
    """Candidates whose artifacts go beside the choice for ``serve --from``'s ladder: the ONNX Runtime
    candidates on the Pareto front, and the fastest INT8 ONNX Runtime candidates inside the budget."""
    names = [n for n in res.pareto if res.by_name(n).backend == "onnxruntime"]
    int8 = [
        c for c in res.candidates
        if c.backend == "onnxruntime" and c.status == "inside-budget" and (c.params.get("quantization"))
        and c.latency() is not None
    ]  # fmt: skip
    int8.sort(key=lambda c: c.latency().at(0.5).value)  # type: ignore[union-attr]
    names += [c.name for c in int8[:2]]
    return list(dict.fromkeys(n for n in names if n != res.chosen))


def export_rungs(ctx: BuildContext, cands: Sequence[Candidate], res: SearchResult, out_dir: Path) -> dict[str, str]:
    """Write ``out_dir/rungs/<name>.onnx`` for :func:`rung_candidates`; name -> path relative to ``out_dir``.
    A candidate whose build fails here is left out (serve says the rung is absent)."""
    by_name = {c.name: c for c in cands}
    out: dict[str, str] = {}
    for name in rung_candidates(res):
        cand = by_name.get(name)
        if cand is None:
            continue
        try:
            runner = cand.build(ctx)
            src = Path(getattr(runner, "model_path"))  # noqa: B009 (an ORT runner's file)
        except Exception:  # reported as an absent rung by serve
            continue
        dst = out_dir / "rungs" / f"{name}.onnx"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        out[name] = str(dst.relative_to(out_dir))
    return out


def _check_sources(path: Path, model: dict[str, Any], force: bool) -> list[str]:
    """Refuse to rebuild a recipe on another model or other inputs than it records (sha256), unless
    ``force``; the mismatches forced through, in words."""
    from latencylab.optimize.adapters import model_digest

    forced = []
    for what, key, digest_key in (("model", "model_path", "model_sha256"), ("inputs", "inputs_path", "inputs_sha256")):
        where, recorded = model.get(key), model.get(digest_key)
        if not where:
            continue
        if not Path(where).exists():
            raise LatencyLabError(f"{path}: the recipe's {what} {where} is not there")
        if not recorded:
            continue
        now = model_digest(where)
        if now != recorded:
            msg = (
                f"{where} is not the {what} this recipe was made from (sha256 {now[:12]}, the recipe records "
                f"{recorded[:12]})"
            )
            if not force:
                raise LatencyLabError(
                    f"{path}: {msg}: rebuilding would measure something else; --force to rebuild anyway"
                )
            forced.append(msg)
    return forced


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
    forced = _check_sources(Path(path), model, force)
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
    doc["recipe"] = {"path": str(path), "recorded": recipe.get("measured"), "reproduced": _brief(
        res.by_name(target.name).to_dict())}  # fmt: skip
    return doc


def _twins(recipe: dict[str, Any]) -> tuple[str, ...]:
    """The baseline's twin under the recipe's shape policy (the equal-work reference), if any."""
    policy = recipe.get("input_policy") or AS_GIVEN
    base = (recipe.get("baseline") or {}).get("name") or "torch-fp32"
    return () if policy == AS_GIVEN or recipe["candidate"] == twin_name(base, policy) else (twin_name(base, policy),)


def _family_of(backend: str) -> str:
    return "onnxruntime" if backend == "onnxruntime" else "torch"


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)

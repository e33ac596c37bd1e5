"""What ``latencylab optimize`` reports: the speed-up split (equal work, the shape policy, total), the
summary and headline of a search, the result document, the default budget and the inputs in words."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from latencylab.optimize.search import (
    DEFAULT_BUDGET_NO_LABELS,
    DEFAULT_BUDGETS,
    TIME_CAP_REASON,
    SearchResult,
)
from latencylab.optimize.shapes import AS_GIVEN
from latencylab.optimize.types import BuildContext
from latencylab.results.optimize import OptimizeResult

if TYPE_CHECKING:
    from latencylab.optimize.lab import LabConfig


def twin_name(baseline: str, policy: str) -> str:
    """The baseline model under another shape policy (e.g. ``torch-fp32-exact``): the reference of the
    equal-work split when the choice changes the inputs."""
    return baseline if policy == AS_GIVEN else f"{baseline}-{policy}"


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
        "baseline": brief(base),
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
        out["chosen"] = brief(ch)
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


def brief(d: dict[str, Any]) -> dict[str, Any]:
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
    summary = summary_of(res, model, cfg.threads)
    if res.build_phase_s is not None:
        summary["phases"] = {"build_s": res.build_phase_s, "timing_s": res.wall_s - res.build_phase_s}
    return OptimizeResult.build(
        summary=summary,
        config=config_dict(cfg),
        model=model,
        wall_s=res.wall_s,
        candidates=[c.to_dict(base_p50 * 1e6 if base_p50 else None, base_sets) for c in res.candidates],
        env=env,
    ).to_dict()


def config_dict(cfg: LabConfig) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}


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

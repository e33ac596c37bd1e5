"""``latencylab optimize --workload gen``: the generative search on SmolLM2, its result, its recipe.

:func:`run_gen_lab` loads the model and its inputs (:func:`smollm2_subject`: built-in prompts,
chat-templated; the corpus's last lines as held-out text; corpus lines that no prompt and no held-out text
uses as calibration text), runs :func:`latencylab.optimize.gen_search.search` over
:func:`latencylab.optimize.gen_candidates.candidates`, and writes ``optimize.json`` and, when a variant was
chosen, ``recipe.json`` to ``out_dir``. :func:`apply_gen_recipe` rebuilds the recipe's variant from its
params and measures it against the FP32 baseline again, on the recipe's prompts, tokens and threads.

No weights file is written: every variant is rebuilt from the FP32 model in seconds (a quantisation, a
draft), so the recipe is the artifact.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.optimize.gen_candidates import (
    GenCandidate,
    GenContext,
    GenInputs,
    GenRunner,
    build,
    candidates,
    from_params,
    set_threads,
)
from latencylab.optimize.gen_search import DEFAULT_GEN_BUDGET, GenBudget, GenSearchResult, ProgressFn, search

KIND = "optimize-gen"
SCHEMA_VERSION = 1
CALIBRATION_START = 100  # corpus lines [100, 100 + n): after every built-in prompt's passages (lines 0-43)


@dataclass(frozen=True, slots=True)
class GenLabConfig:
    budget: str | None = None
    threads: int = 1
    time_budget_s: float | None = 600.0
    rounds: int = 2
    tokens: int = 24  # output tokens per timed request (EOS ignored) and N of the fidelity answers
    only: tuple[str, ...] = ()  # candidate names to keep besides the baseline; empty = all
    fidelity_prompts: tuple[int, ...] = (0, 3, 5, 8, 10, 12)  # indices into the built-in prompt set
    timing_prompts: tuple[int, ...] = (1, 9, 14)
    texts: int = 16  # held-out corpus lines for perplexity
    calibration: int = 8  # corpus lines for the sensitivity ranking
    validation: int = 8  # the corpus lines after them: judge the validated screen's keep (never scored)

    @classmethod
    def quick(cls, **kw: Any) -> GenLabConfig:
        """A small search for tests and smoke runs: 2 fidelity prompts, 1 timing prompt, 8 tokens, 1 round."""
        base: dict[str, Any] = {"rounds": 1, "tokens": 8, "fidelity_prompts": (0, 8), "timing_prompts": (1,)}
        base |= {"texts": 4, "calibration": 2, "validation": 2}
        return cls(**(base | kw))


@dataclass(frozen=True, slots=True)
class GenSubject:
    """The model under search and its inputs; ``describe`` goes into the result and the recipe."""

    model: Any
    inputs: GenInputs
    describe: Mapping[str, Any] = field(default_factory=dict)


def smollm2_subject(cfg: GenLabConfig) -> GenSubject:
    """The packaged SmolLM2-135M-Instruct (FP32) and the inputs of ``cfg`` (module docstring)."""
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_decode import eos_ids
    from latencylab.workloads.gen_fidelity import heldout_ids
    from latencylab.workloads.gen_model import MODEL_NAME, load_model
    from latencylab.workloads.gen_prompts import builtin_prompts
    from latencylab.workloads.text import corpus

    lm = load_model()
    tok, prompts = lm.tokenizer, builtin_prompts()
    for i in (*cfg.fidelity_prompts, *cfg.timing_prompts):
        if not 0 <= i < len(prompts):
            raise LatencyLabError(f"prompt index {i} is outside the built-in set (0-{len(prompts) - 1})")

    def ids(idx: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(chat_ids(tok, messages_of(prompts[i]))) for i in idx)

    lines = corpus()[CALIBRATION_START : CALIBRATION_START + cfg.calibration]
    vstart = CALIBRATION_START + cfg.calibration
    vlines = corpus()[vstart : vstart + cfg.validation]
    inputs = GenInputs(
        fidelity_prompts=ids(cfg.fidelity_prompts),
        timing_prompts=ids(cfg.timing_prompts),
        texts=tuple(tuple(s) for s in heldout_ids(tok, cfg.texts)),
        calibration=tuple(tuple(tok(s)["input_ids"][:64]) for s in lines),
        validation=tuple(tuple(tok(s)["input_ids"][:64]) for s in vlines),
        eos=eos_ids(tok, lm.model),
        labels={
            "fidelity": [prompts[i].label for i in cfg.fidelity_prompts],
            "timing": [prompts[i].label for i in cfg.timing_prompts],
        },
    )
    return GenSubject(lm.model, inputs, {"model": MODEL_NAME, "key": lm.path.name, "dtype": "fp32"})


def _select(cands: list[GenCandidate], only: Sequence[str]) -> list[GenCandidate]:
    if not only:
        return cands
    missing = set(only) - {c.name for c in cands}
    if missing:
        raise LatencyLabError(f"unknown candidate(s) {sorted(missing)}; known: {', '.join(c.name for c in cands)}")
    return [cands[0], *(c for c in cands[1:] if c.name in only)]


def run_gen_lab(
    cfg: GenLabConfig,
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
    subject: GenSubject | None = None,
    builder: Callable[[GenContext, Mapping[str, Any]], GenRunner] = build,
    context: Callable[[GenSubject], GenContext] | None = None,
) -> dict[str, Any]:
    """The whole generative lab; returns the result document (``subject``, ``builder`` and ``context``
    replace the real model, :func:`build` and the context for tests)."""
    budget = GenBudget.parse(cfg.budget or DEFAULT_GEN_BUDGET)
    if out_dir is not None:
        from latencylab.optimize.lab_export import check_writable

        check_writable(out_dir, "--out", is_dir=True)
    subject = subject or smollm2_subject(cfg)
    ctx = context(subject) if context else GenContext(subject.model, subject.inputs, cfg.threads)
    cands = _select(candidates(ctx), cfg.only)
    set_threads(cfg.threads)
    res = search(ctx, cands, budget, cfg.tokens, cfg.rounds, cfg.time_budget_s, progress, builder)
    doc = result_doc(cfg, subject, res)
    if out_dir is None:
        return doc
    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = out_dir / "recipe.json"
    if res.chosen is not None:
        chosen = res.by_name(res.chosen)
        recipe = {
            "kind": "recipe", "schema_version": SCHEMA_VERSION, "workload": "gen", "model": dict(subject.describe),
            "candidate": chosen.name, "family": chosen.family, "params": chosen.params,
            "exact_by_construction": chosen.exact, "keep_float_layers": chosen.stats.get("keep_float_layers"),
            "threads": cfg.threads, "budget": budget.text, "tokens": cfg.tokens, "rounds": cfg.rounds,
            "fidelity_prompts": list(cfg.fidelity_prompts), "timing_prompts": list(cfg.timing_prompts),
            "texts": cfg.texts, "calibration": cfg.calibration, "validation": cfg.validation,
            "measured": brief(doc, chosen.name),
            "baseline": brief(doc, res.baseline), "headline": res.verdict, "created_at": doc["created_at"],
        }  # fmt: skip
        stale.write_text(json.dumps(recipe, indent=1))
        doc["recipe"] = str(stale)
    elif stale.is_file() and json.loads(stale.read_text()).get("workload") == "gen":
        stale.unlink()  # an older search's recipe would describe a choice this search did not make
        doc["out_removed"] = ["recipe.json"]
    (out_dir / "optimize.json").write_text(json.dumps(doc, indent=1, default=str))
    return doc


def result_doc(cfg: GenLabConfig, subject: GenSubject, res: GenSearchResult) -> dict[str, Any]:
    from latencylab.env import fingerprint
    from latencylab.results.base import utc_now

    chosen = res.chosen
    summary = {
        "budget": res.budget, "baseline": res.baseline, "chosen": chosen, "verdict": res.verdict,
        "headline": "TPOT at equal work (same prompts, same output tokens, same threads)",
        "speedup_tpot": res.speedups[chosen]["tpot"] if chosen else None, "speedups": dict(res.speedups),
        "tokens": res.tokens, "rounds": res.rounds, "wall_s": res.wall_s,
    }  # fmt: skip
    return {
        "kind": KIND, "schema_version": SCHEMA_VERSION, "created_at": utc_now(), "workload": "gen",
        "model": dict(subject.describe), "config": dataclasses.asdict(cfg),
        "inputs": {"labels": {k: list(v) for k, v in subject.inputs.labels.items()},
                   "fidelity_prompts": len(subject.inputs.fidelity_prompts),
                   "timing_prompts": len(subject.inputs.timing_prompts), "texts": len(subject.inputs.texts),
                   "calibration": len(subject.inputs.calibration),
                   "validation": len(subject.inputs.validation)},
        "candidates": [c.to_dict() for c in res.candidates], "summary": summary,
        "env": fingerprint(sample_s=0.0),
    }  # fmt: skip


def brief(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The figures a recipe records of one candidate (and ``--recipe`` compares)."""
    c = next(c for c in doc["candidates"] if c["name"] == name)
    f = c.get("fidelity") or {}
    sp = (doc["summary"]["speedups"].get(name) or {}).get("tpot")
    keys = ("token_agreement", "exact", "top1", "ppl_delta")
    return {"name": name, "tpot_ms": c.get("tpot_ms"), "ttft_p50_ms": c.get("ttft_p50_ms"), "speedup_tpot": sp,
            **{k: f.get(k) for k in keys}}  # fmt: skip


def apply_gen_recipe(
    path: Path,
    progress: ProgressFn | None = None,
    force: bool = False,
    subject: GenSubject | None = None,
    builder: Callable[[GenContext, Mapping[str, Any]], GenRunner] = build,
    context: Callable[[GenSubject], GenContext] | None = None,
) -> dict[str, Any]:
    """Rebuild a gen recipe's variant and measure it against the FP32 baseline again."""
    try:
        recipe = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable recipe ({exc.__class__.__name__})") from exc
    if recipe.get("kind") != "recipe" or recipe.get("workload") != "gen":
        raise LatencyLabError(f"{path}: not a latencylab gen recipe")
    cfg = GenLabConfig(
        budget=recipe["budget"], threads=int(recipe["threads"]), time_budget_s=None, rounds=int(recipe["rounds"]),
        tokens=int(recipe["tokens"]), fidelity_prompts=tuple(recipe["fidelity_prompts"]),
        timing_prompts=tuple(recipe["timing_prompts"]), texts=int(recipe["texts"]),
        calibration=int(recipe["calibration"]), validation=int(recipe.get("validation", 8)),
    )  # fmt: skip
    subject = subject or smollm2_subject(cfg)
    forced = []
    want, have = (recipe.get("model") or {}).get("key"), subject.describe.get("key")
    if want != have:
        msg = f"the recipe was made on model {want!r}, this one is {have!r}"
        if not force:
            raise LatencyLabError(f"{path}: {msg} (--force rebuilds anyway)")
        forced.append(msg)
    ctx = context(subject) if context else GenContext(subject.model, subject.inputs, cfg.threads)
    base = candidates(ctx)[0]
    cand = from_params(recipe["candidate"], recipe["family"], recipe["params"], bool(recipe["exact_by_construction"]))
    cands = [base] if cand.name == base.name else [base, cand]
    set_threads(cfg.threads)
    res = search(ctx, cands, GenBudget.parse(cfg.budget or DEFAULT_GEN_BUDGET), cfg.tokens, cfg.rounds, None,
                 progress, builder)  # fmt: skip
    doc = result_doc(cfg, subject, res)
    kept = res.by_name(cand.name).stats.get("keep_float_layers")
    if kept != recipe.get("keep_float_layers"):
        forced.append(f"the sensitivity ranking kept {kept}, the recipe recorded {recipe.get('keep_float_layers')}")
    doc["recipe"] = {"path": str(path), "recorded": recipe.get("measured"), "reproduced": brief(doc, cand.name),
                     "forced": forced}  # fmt: skip
    return doc


def render_gen(doc: Mapping[str, Any], console: Any) -> None:
    """The result as a table, then the verdict (``latencylab optimize --workload gen``)."""
    from rich.table import Table

    s = doc["summary"]
    t = Table(title=f"latencylab optimize --workload gen: {doc['model'].get('model')} (budget {s['budget']}; "
              f"{s['tokens']} tokens, {s['rounds']} rounds)", title_justify="left")  # fmt: skip
    cols = ("candidate", "status", "TPOT ms", "x", "TPOT p50/p99", "TTFT p50/p99", "acc / tok/step",
            "agree / exact / top1 / ppl", "why")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right" if col in ("TPOT ms", "x") else "left")
    for c in doc["candidates"]:
        f, sp = c.get("fidelity") or {}, (s["speedups"].get(c["name"]) or {}).get("tpot")
        fid = "-"
        if f:
            fid = f"{f['token_agreement']:.3f} / {f['exact']:.2f} / {f['top1']:.3f} / {100 * f['ppl_delta']:+.2f}%"
            fid += " (exact by construction)" if c["exact_by_construction"] else ""
        spec = "-" if c.get("tokens_per_step") is None else f"{c['acceptance'] or 0:.2f} / {c['tokens_per_step']:.2f}"
        name = f"[bold]{c['name']}[/bold]" if c["name"] == s.get("chosen") else c["name"]
        t.add_row(
            name, c["status"], "-" if c.get("tpot_ms") is None else f"{c['tpot_ms']:.1f}",
            "-" if sp is None else f"{sp:.2f}x",
            f"{c['tpot_p50_ms']:.1f} / {c['tpot_p99_ms']:.1f}" if c.get("tpot_p50_ms") is not None else "-",
            f"{c['ttft_p50_ms']:.0f} / {c['ttft_p99_ms']:.0f}" if c.get("ttft_p50_ms") is not None else "-",
            spec, fid, c["reason"],
        )  # fmt: skip
    console.print(t)
    console.print(f"headline: {s['headline']}; x = the baseline's TPOT / the candidate's", markup=False)
    console.print(f"[bold]{s['verdict']}[/bold]")
    if doc.get("recipe") and isinstance(doc["recipe"], str):
        console.print(f"recipe: {doc['recipe']}", markup=False)


def is_gen_recipe(path: str | Path) -> bool:
    try:
        return json.loads(Path(path).read_text()).get("workload") == "gen"
    except (OSError, ValueError, AttributeError):
        return False


def run_gen_command(args: Any, console: Any) -> int:
    """``latencylab optimize --workload gen`` (or ``--recipe`` of a gen recipe): parse, run, render, write."""
    import sys

    if args.model or args.pipeline or args.inputs:
        raise LatencyLabError(
            "--workload gen searches the packaged SmolLM2: --model, --pipeline, --inputs do not apply"
        )
    if args.force and not args.recipe:
        raise LatencyLabError("--force only applies with --recipe")

    def progress(msg: str, step: int, total: int) -> None:
        if not args.quiet:
            print(f"optimize gen: [{step}/{total}] {msg}", file=sys.stderr, flush=True)

    if args.recipe:
        doc = apply_gen_recipe(Path(args.recipe), progress, force=args.force)
    else:
        kw: dict[str, Any] = {"budget": args.budget, "threads": args.threads, "time_budget_s": args.time_budget,
                              "only": tuple(x.strip() for x in (args.only or "").split(",") if x.strip())}  # fmt: skip
        if args.rounds is not None:
            kw["rounds"] = args.rounds
        cfg = GenLabConfig.quick(**kw) if getattr(args, "quick", False) else GenLabConfig(**kw)
        doc = run_gen_lab(cfg, Path(args.out) if args.out else None, progress)
    render_gen(doc, console)
    if args.recipe:
        rec = doc["recipe"]
        console.print(f"recipe recorded: {rec['recorded']}\nreproduced now:  {rec['reproduced']}", markup=False)
        for msg in rec.get("forced") or []:
            console.print(f"--force: {msg}", markup=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        console.print(f"wrote {args.json}", markup=False)
    return 0

"""``latencylab experiment``: run the pipeline experiments on the built-in workloads and print their tables.

``python -m latencylab.optimize.experiments`` is an alias (:func:`main`)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from latencylab.optimize.experiments.glue import text_forward_fn, vision_forward_fn, vision_stages
from latencylab.optimize.experiments.overlap import format_overlap, pipeline_overlap
from latencylab.optimize.experiments.shapes import format_shape, shape_policy
from latencylab.optimize.experiments.sweeps import batch_sweep, format_sweep, thread_sweep
from latencylab.timing import env_or_fingerprint

EXPERIMENTS = ("shapes", "overlap", "threads", "batch")


@dataclass(frozen=True, slots=True)
class ExperimentOptions:
    """What ``latencylab experiment`` runs: which experiments, how long, where the JSON goes."""

    only: tuple[str, ...] = field(default=EXPERIMENTS, metadata={"help": "experiments to run"})
    json: str | None = field(default=None, metadata={"help": "write every result here"})
    quick: bool = field(default=False, metadata={"help": "fewer items and rounds (a smoke run)"})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExperimentOptions:
        return cls(only=tuple(args.only or EXPERIMENTS), json=args.json, quick=bool(args.quick))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``latencylab experiment`` options (also those of ``python -m latencylab.optimize.experiments``)."""
    ap.add_argument("--only", choices=EXPERIMENTS, action="append", help="run only this one (repeatable)")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--quick", action="store_true", help="fewer items and rounds (a smoke run)")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m latencylab.optimize.experiments``: the same as ``latencylab experiment``."""
    ap = argparse.ArgumentParser(prog="python -m latencylab.optimize.experiments", description=__doc__)
    add_arguments(ap)
    return run_experiments(ExperimentOptions.from_args(ap.parse_args(argv)))


def run_experiment_command(args: argparse.Namespace) -> int:
    return run_experiments(ExperimentOptions.from_args(args))


def run_experiments(opts: ExperimentOptions) -> int:
    """Run the experiments on the built-in workloads; print the tables, optionally save JSON."""
    which = set(opts.only)
    quick = opts.quick
    env = env_or_fingerprint(None)
    out: dict[str, Any] = {}
    text_model: tuple[Any, Any] | None = None
    vision_model: Any = None

    def text_parts() -> tuple[Any, Any]:
        nonlocal text_model
        if text_model is None:
            from latencylab.workloads import text as text_wl

            text_model = text_wl.load_model()
        return text_model

    def vision_parts() -> tuple[Any, list[bytes]]:
        nonlocal vision_model
        from latencylab.workloads import vision

        if vision_model is None:
            vision_model = vision.load_model().model
        return vision_model, list(vision.heldout_set().jpegs)

    if "shapes" in which:
        from latencylab.workloads import text as text_wl

        tok, model = text_parts()
        texts = list(text_wl.corpus())[: 80 if quick else None]
        for bs in (1, 8):
            r = shape_policy(texts, tok, model, batch_size=bs, rounds=4 if quick else 10, env=env)
            out[f"shape_policy_b{bs}"] = r.to_dict()
            print(format_shape(r), "\n", flush=True)
    if "overlap" in which:
        model, jpegs = vision_parts()
        prepare, infer = vision_stages(model)
        ov = pipeline_overlap(
            jpegs[: 40 if quick else 200],
            prepare,
            infer,
            rounds=3 if quick else 15,
            reference_threads=os.cpu_count() if (os.cpu_count() or 1) > 1 else None,
            label="vision: JPEG 224 -> decode -> resize 64 -> digits CNN",
            env=env,
        )
        out["pipeline_overlap"] = ov.to_dict()
        print(format_overlap(ov), "\n", flush=True)
    threads = tuple(range(1, (os.cpu_count() or 1) + 1))
    rounds = 3 if quick else 8
    if "threads" in which:
        tok, tmodel = text_parts()
        ts = thread_sweep(
            text_forward_fn(tok, tmodel, 1),
            threads,
            rounds=rounds,
            calls_per_round=5 if quick else 15,
            label="text MiniLM FP32 forward+pool, batch 1 x 128",
            env=env,
        )
        out["thread_sweep_text"] = ts.to_dict()
        print(format_sweep(ts), "\n", flush=True)
        vmodel, jpegs = vision_parts()
        vs = thread_sweep(
            vision_forward_fn(vmodel, jpegs, 1),
            threads,
            rounds=rounds,
            calls_per_round=20 if quick else 100,
            label="vision digits CNN forward, batch 1 x 3x64x64",
            env=env,
        )
        out["thread_sweep_vision"] = vs.to_dict()
        print(format_sweep(vs), "\n", flush=True)
    if "batch" in which:
        tok, tmodel = text_parts()
        bt = batch_sweep(
            lambda b: text_forward_fn(tok, tmodel, b),
            (1, 2, 4, 8, 16),
            rounds=rounds,
            items_per_round=16 if quick else 32,
            label="text MiniLM FP32 forward+pool, seq 128",
            env=env,
        )
        out["batch_sweep_text"] = bt.to_dict()
        print(format_sweep(bt), "\n", flush=True)
        vmodel, jpegs = vision_parts()
        bv = batch_sweep(
            lambda b: vision_forward_fn(vmodel, jpegs, b),
            (1, 2, 4, 8, 16),
            rounds=rounds,
            items_per_round=64 if quick else 256,
            label="vision digits CNN forward, 3x64x64",
            env=env,
        )
        out["batch_sweep_vision"] = bv.to_dict()
        print(format_sweep(bv), "\n", flush=True)
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

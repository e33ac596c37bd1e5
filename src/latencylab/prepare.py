"""``latencylab prepare``: build, once and offline, what the built-in workloads would otherwise build on first use.

Every step writes to ``$LATENCYLAB_CACHE`` (default ``~/.cache/latencylab``), keyed so that a change of data,
config or library versions builds again, and is a cache hit (seconds) when already done:

* ``vision``: train the digits CNN of ``--workload vision`` (sklearn's digits, a few seconds to a minute);
* ``gen``: convert SmolLM2-135M-Instruct from the packaged GGUF file to a safetensors directory (about a minute;
  later loads take seconds);
* ``gen-reference``: SmolLM2's FP32 greedy answers and held-out perplexity, the fidelity reference that the INT8
  rung of ``serve --model gen`` and speculative decoding are scored against (about a minute once);
* ``roofline``: measure this machine's compute and memory peaks (quick set, as the tests read them).

The Makefile runs it before ``make test`` and ``make run``, so a fresh clone pays these costs in its set-up,
as a user's first run would, not inside timed tests.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from latencylab.errors import LatencyLabError


def _vision() -> str:
    from latencylab.workloads.vision import load_model

    trained = load_model()
    how = "cached" if trained.from_cache else f"trained in {trained.train_seconds:.1f} s"
    return f"digits CNN {how}, held-out accuracy {trained.test_accuracy:.1%} ({trained.path})"


def _gen() -> str:
    from latencylab.workloads.gen_model import load_model

    m = load_model()
    return f"SmolLM2 {'converted' if m.converted else 'cached'} in {m.load_s:.1f} s ({m.path})"


def _gen_reference() -> str:
    from latencylab.workloads.gen_fidelity import reference

    ref = reference()
    return f"SmolLM2 fidelity reference, {len(ref.prompts)} prompts x {ref.max_tokens} tokens"


def _roofline() -> str:
    from latencylab.roofline.peaks import load_or_measure

    peaks = load_or_measure(quick=True)
    return f"peaks of this machine ({peaks.key}, clock {peaks.clock_ghz or 0:.2f} GHz)"


STEPS: dict[str, Callable[[], str]] = {
    "vision": _vision,
    "gen": _gen,
    "gen-reference": _gen_reference,
    "roofline": _roofline,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", help=f"comma-separated steps (default: all of {', '.join(STEPS)}); a step's extra missing: skipped"
    )


def run_prepare_command(args: argparse.Namespace) -> int:
    names: Sequence[str] = [s.strip() for s in args.only.split(",")] if args.only else list(STEPS)
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise LatencyLabError(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    for name in names:
        t0 = time.perf_counter()
        try:
            what = STEPS[name]()
        except ImportError as exc:  # an optional extra not installed: nothing to prepare for it
            print(f"prepare {name}: skipped ({exc.name or exc} not installed)", flush=True)
            continue
        print(f"prepare {name}: {what}; {time.perf_counter() - t0:.1f} s", flush=True)
    return 0

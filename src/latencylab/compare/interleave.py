"""``latencylab compare --run A B``: measure two pipelines interleaved in time, then compare them paired.

This is the one place compare measures instead of reading files; the measuring itself is the
profiler's (``profiler.profile_interleaved``): ``rounds`` rounds, each running A and B once in an order
drawn afresh (randomised blocks), every run with its own warm-up and ``iterations`` timed iterations.
A drift of the machine's speed then hits A and B alike within a round, and the paired test on the
per-round ratios (``compare.stats.run_delta(paired=True)``) cancels it.

A *spec* is the source part of a ``latencylab profile`` command line, as one string::

    "--workload synthetic --param stages=forward:constant(1ms)"
    "--model m.onnx --threads 2"
    "--pipeline mypkg.pipes:make --param variant=fast"

Options: ``--workload``, ``--model`` (with ``--inputs``), ``--pipeline``, ``--param KEY=VALUE``
(repeatable), ``--threads``, ``--batch-size``, ``--device``, ``--seed``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from latencylab.errors import LatencyLabError

if TYPE_CHECKING:
    from latencylab.pipeline import Pipeline
    from latencylab.results import ProfileResult

# Many short runs rather than a few long ones: a block of 100 ~1-ms iterations lasts a tenth of a second, so
# A and B of one round see the same machine (other work on a shared host comes and goes over seconds), and
# 20 rounds give the paired t test 19 degrees of freedom.
DEFAULT_ROUNDS = 20
DEFAULT_ITERATIONS = 100


class _SpecParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise LatencyLabError(f"{self.prog}: {message}")


@dataclass(frozen=True, slots=True)
class Spec:
    """One side of an interleaved comparison: how to build its pipeline (parsed from a spec string)."""

    text: str
    workload: str | None
    model: str | None
    pipeline: str | None
    inputs: str | None
    params: tuple[tuple[str, str], ...]
    threads: int | None
    batch_size: int
    device: str
    seed: int

    @classmethod
    def parse(cls, text: str, side: str = "spec") -> Spec:
        p = _SpecParser(prog=f"compare --run {side}", add_help=False)
        src = p.add_mutually_exclusive_group()
        src.add_argument("--workload")
        src.add_argument("--model")
        src.add_argument("--pipeline")
        p.add_argument("--inputs")
        p.add_argument("--param", action="append", default=[])
        p.add_argument("--threads", type=int)
        p.add_argument("--batch-size", type=int, default=1)
        p.add_argument("--device", default="cpu")
        p.add_argument("--seed", type=int, default=0)
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise LatencyLabError(f"compare --run {side}: cannot split {text!r}: {exc}") from None
        ns = p.parse_args(words)
        params = []
        for item in ns.param:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise LatencyLabError(f"compare --run {side}: --param {item!r} must look like key=value")
            params.append((key.strip(), value))
        if ns.threads is not None and ns.threads < 1:
            raise LatencyLabError(f"compare --run {side}: --threads must be >= 1")
        if ns.batch_size < 1:
            raise LatencyLabError(f"compare --run {side}: --batch-size must be >= 1")
        if ns.inputs and not ns.model:
            raise LatencyLabError(f"compare --run {side}: --inputs only applies with --model")
        return cls(
            text, ns.workload, ns.model, ns.pipeline, ns.inputs, tuple(params), ns.threads, ns.batch_size,
            ns.device, ns.seed,
        )  # fmt: skip

    def build(self, warmup: int) -> Pipeline:
        """The pipeline, built as ``latencylab profile`` builds it."""
        from latencylab.workloads import build_source, source_options

        opts = source_options(
            workload=self.workload, model=self.model, inputs=self.inputs, params=dict(self.params),
            threads=self.threads, batch_size=self.batch_size, device=self.device, seed=self.seed, warmup=warmup,
        )  # fmt: skip
        return build_source(self.workload, self.model, self.pipeline, opts)


def run_interleaved(
    specs: Sequence[str],
    rounds: int = DEFAULT_ROUNDS,
    iterations: int = DEFAULT_ITERATIONS,
    warmup: int = 10,
    seed: int = 0,
    env: dict[str, Any] | None = None,
) -> list[ProfileResult]:
    """Build each spec's pipeline and measure them in ``rounds`` interleaved rounds (module docstring)."""
    from latencylab.profiler import ProfileConfig, apply_threads, profile_interleaved

    if rounds < 2:
        raise LatencyLabError("compare --run needs at least 2 rounds (the paired test needs two differences)")
    parsed = [Spec.parse(t, side) for t, side in zip(specs, "ABCDEFGH", strict=False)]
    pipes = [s.build(warmup) for s in parsed]
    threads = [s.threads for s in parsed]

    def before_run(k: int, _run: int) -> None:
        apply_threads(threads[k])  # torch's thread count is per process: set it for the side about to run

    cfg = ProfileConfig(warmup=warmup, iterations=iterations, runs=rounds)
    return profile_interleaved(pipes, cfg, env=env, seed=seed, before_run=before_run)

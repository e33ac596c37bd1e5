"""The rule registry: every rule is ``(results: Sequence[LoadedResult]) -> list[Finding]``.

One small module per rule (or per family of closely related rules); add a rule by adding its function
here. ``latencylab.diagnose.engine.diagnose_results`` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from latencylab.diagnose.rules import (
    batching,
    environment,
    gen_search,
    machine,
    periodic,
    preprocess,
    roofline,
    shapes,
    spikes,
    tokens,
    transfer,
    variance,
    variants,
)
from latencylab.findings import Finding
from latencylab.results import LoadedResult

Rule = Callable[[Sequence[LoadedResult]], list[Finding]]

RULES: dict[str, Rule] = {
    "preprocess-dominates": preprocess.rule,
    "spikes": spikes.rule,  # latency-jump, stall, recompilation
    "periodic-swings": periodic.rule,
    "shape-variance": shapes.rule,
    "batch-non-monotonic": batching.rule,
    "transfer-blocking": transfer.rule,
    "environment": environment.rule,  # thread-oversubscription, noisy-environment
    "variants": variants.rule,  # int8-slower, prune-no-faster
    "unstable-explained": variance.rule,  # how much of the IQR the input and the runs explain (issue 23)
    "machine-speed": machine.rule,  # the canary: the machine's speed moved within or between results
    "roofline": roofline.rule,  # optimize variants placed on this machine's roofline (peaks cached per machine)
    "token-stream": tokens.rule,  # token-stalls, ttft-queueing (generative load results)
    "gen-search": gen_search.rule,  # optimize --workload gen: faster-rejected, no-choice, spec acceptance, ...
}

__all__ = ["RULES", "Rule"]

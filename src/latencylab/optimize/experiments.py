"""Pipeline-level optimisation experiments: change how the pipeline runs, not the model's weights.

Four measurements, each interleaved (the variants take turns in rounds, A B, B A, ..., in one process, so
machine drift hits them alike) and summarised with :func:`latencylab.stats.summarize` (percentile
bootstrap CIs):

* :func:`shape_policy` (text): pad every input to a fixed maximum, pad exactly (to the longest of the
  batch), or pad to a few length buckets (:func:`choose_buckets`). Reports latency per item, padded
  tokens per real token and whether the embeddings stay equal to the exact policy's.
* :func:`pipeline_overlap` (vision): serial decode -> preprocess -> forward per input against a
  double-buffered data path (a producer thread prepares input i+1 while the model runs input i, through a
  bounded queue). Reports throughput and per-item latency.
* :func:`thread_sweep` and :func:`batch_sweep`: per-item latency and throughput per setting;
  :func:`non_monotonic` flags batch sizes that are slower per item than a smaller batch.

Every function returns a frozen result with ``to_dict()`` (JSON-serialisable, raw samples included, the
derived statistics beside them). ``python -m latencylab.optimize.experiments`` runs them all on the
built-in workloads and prints the tables.

Timing uses a :class:`~latencylab.clock.Clock` (``perf_counter_ns`` by default; tests inject a
:class:`~latencylab.clock.FakeClock` and get exact numbers).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError, require
from latencylab.results import SCHEMA_VERSION, utc_now

BUCKET_METHODS = ("min-waste", "quantile")


# ================================================================== pure functions


def choose_buckets(
    lengths: Sequence[int],
    coverage: float = 0.95,
    k: int = 3,
    method: str = "min-waste",
    multiple: int = 1,
) -> list[int]:
    """Up to ``k`` ascending bucket edges (padded lengths) for inputs of the given ``lengths``.

    The largest edge is the ``coverage`` quantile of ``lengths`` (inverted-CDF definition: the smallest
    length L such that at least ``coverage`` of the inputs are <= L), so that ``coverage`` of the inputs
    fit the largest bucket; inputs above it are meant to go to the model's maximum length, which is not in
    the list. The other ``k - 1`` edges:

    * ``method="quantile"``: the inverted-CDF quantiles at ``coverage * i / k`` for i = 1..k-1;
    * ``method="min-waste"`` (default): the edges that minimise the total padding of the covered inputs
      (sum over inputs of edge - length), found exactly by dynamic programming over the distinct lengths
      (an optimal edge always equals some input length). On a skewed distribution (many short queries,
      a long tail of passages) this puts edges where the inputs are, which evenly spaced quantiles do not.

    ``multiple`` rounds every edge up to a multiple of it (e.g. 8 for vector-friendly shapes); equal edges
    are merged, so fewer than ``k`` edges come back when the inputs have fewer distinct lengths.
    """
    if not lengths:
        raise LatencyLabError("choose_buckets needs at least one length")
    if not 0 < coverage <= 1:
        raise LatencyLabError(f"coverage must be in (0, 1], got {coverage}")
    if k < 1:
        raise LatencyLabError(f"k must be >= 1, got {k}")
    if multiple < 1:
        raise LatencyLabError(f"multiple must be >= 1, got {multiple}")
    if method not in BUCKET_METHODS:
        raise LatencyLabError(f"method must be one of {', '.join(BUCKET_METHODS)}, got {method!r}")
    srt = sorted(int(x) for x in lengths)
    if srt[0] < 1:
        raise LatencyLabError(f"lengths must be >= 1, got {srt[0]}")
    top = _inverted_cdf(srt, coverage)
    if method == "quantile":
        edges = [_inverted_cdf(srt, coverage * i / k) for i in range(1, k)] + [top]
    else:
        edges = _min_waste_edges([x for x in srt if x <= top], k)
    rounded = sorted({-(-e // multiple) * multiple for e in edges})
    return rounded


def _inverted_cdf(srt: Sequence[int], q: float) -> int:
    """Smallest sample value with at least a fraction ``q`` of the samples <= it (``srt`` sorted)."""
    idx = max(0, math.ceil(q * len(srt) - 1e-9) - 1)
    return int(srt[min(idx, len(srt) - 1)])


def _min_waste_edges(srt: Sequence[int], k: int) -> list[int]:
    """Exact DP: at most ``k`` edges, the last one max(srt), minimising sum(edge(x) - x)."""
    values = sorted(set(srt))
    m = len(values)
    if m <= k:
        return values
    counts = [0] * m
    for x in srt:
        counts[values.index(x)] += 1  # m is small (<= a few hundred distinct lengths)
    pre_n = [0] * (m + 1)
    pre_s = [0] * (m + 1)
    for i, (v, c) in enumerate(zip(values, counts, strict=True)):
        pre_n[i + 1] = pre_n[i] + c
        pre_s[i + 1] = pre_s[i] + c * v

    def cost(a: int, b: int) -> int:  # inputs with index in (a, b] padded to values[b]; a = -1: from the start
        n = pre_n[b + 1] - pre_n[a + 1]
        return n * values[b] - (pre_s[b + 1] - pre_s[a + 1])

    inf = float("inf")
    best: list[list[float]] = [[inf] * m for _ in range(k + 1)]
    back = [[-1] * m for _ in range(k + 1)]
    for i in range(m):
        best[1][i] = float(cost(-1, i))
    for j in range(2, k + 1):
        for i in range(m):
            for p in range(i):
                total = best[j - 1][p] + cost(p, i)
                if total < best[j][i]:
                    best[j][i], back[j][i] = total, p
    edges = [values[-1]]
    i, j = m - 1, k
    while j > 1 and back[j][i] >= 0:
        i = back[j][i]
        j -= 1
        edges.append(values[i])
    return sorted(edges)


def bucket_for(length: int, edges: Sequence[int], max_length: int) -> int:
    """The padded length for an input of ``length``: the smallest edge >= it, else ``max_length``."""
    for e in edges:
        if length <= e <= max_length:
            return int(e)
    return int(max_length)


def padding_waste(lengths: Sequence[int], padded: Sequence[int]) -> float:
    """Padded tokens per real token: sum(padded - length) / sum(length) (0 means no padding at all)."""
    real = sum(lengths)
    if real <= 0:
        raise LatencyLabError("padding_waste needs a positive total length")
    return (sum(padded) - real) / real


def non_monotonic(throughputs_by_batch: Mapping[int, float], tolerance: float = 0.0) -> list[str]:
    """Batch sizes whose per-item throughput is lower than a smaller batch size's.

    Walks the batch sizes in ascending order and compares each with the best smaller one; a batch is
    flagged when its throughput is below ``(1 - tolerance)`` x that best (the seeds' "batch 8 slower per
    item than batch 4" symptom: throughput against batch size is not monotonic). Returns one message per
    flagged batch size, in ascending order of batch size.
    """
    if not 0 <= tolerance < 1:
        raise LatencyLabError(f"tolerance must be in [0, 1), got {tolerance}")
    flags: list[str] = []
    best_b: int | None = None
    best_t = -math.inf
    for b, t in sorted(throughputs_by_batch.items()):
        if b < 1:
            raise LatencyLabError(f"batch sizes must be >= 1, got {b}")
        if not math.isfinite(t) or t < 0:
            raise LatencyLabError(f"throughput for batch {b} must be finite and >= 0, got {t}")
        if best_b is not None and t < best_t * (1.0 - tolerance):
            flags.append(
                f"batch {b}: {t:.4g} items/s is lower than batch {best_b}'s {best_t:.4g} items/s "
                f"({t / best_t - 1:+.0%})"
            )
        if t > best_t:
            best_b, best_t = b, t
    return flags


# ================================================================== timing primitives


@dataclass(frozen=True, slots=True)
class VariantTiming:
    """Timed calls of one variant: ``samples_ns[i]`` is call i's duration; each call handles ``items_per_call``.

    Per-item latency of a call is its duration / ``items_per_call`` (for a batch, the per-item cost; the
    latency one request in the batch sees is the whole call). Throughput is items / busy time.
    """

    name: str
    items_per_call: int
    samples_ns: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.items_per_call < 1:
            raise LatencyLabError(f"{self.name}: items_per_call must be >= 1")
        if not self.samples_ns:
            raise LatencyLabError(f"{self.name}: no timed calls")

    @property
    def n_calls(self) -> int:
        return len(self.samples_ns)

    def per_item_ms(self) -> np.ndarray:
        return np.asarray(self.samples_ns, dtype=np.float64) / self.items_per_call / 1e6

    def summary(self) -> stats.Summary:
        """Per-item latency in ms: mean, p50 and p99 with bootstrap CIs, plus stability warnings."""
        return stats.summarize(self.per_item_ms(), qs=(0.5, 0.99), label=self.name)

    @property
    def items_per_s(self) -> float:
        total = sum(self.samples_ns)
        return 0.0 if total <= 0 else self.items_per_call * self.n_calls / (total / 1e9)

    def to_dict(self) -> dict[str, Any]:
        s = self.summary()
        p50, p99 = s.at(0.5), s.at(0.99)
        return {
            "name": self.name,
            "items_per_call": self.items_per_call,
            "n_calls": self.n_calls,
            "per_item_ms": {
                "mean": s.mean,
                "p50": p50.value,
                "p50_ci": [p50.ci_low, p50.ci_high],
                "p99": p99.value,
                "p99_ci": [p99.ci_low, p99.ci_high],
            },
            "call_ms_p50": float(np.median(self.samples_ns)) / 1e6,
            "items_per_s": self.items_per_s,
            "warnings": list(s.warnings),
            "samples_ns": list(self.samples_ns),
        }


@dataclass(frozen=True, slots=True)
class Arm:
    """One variant in an interleaved comparison.

    ``call(j)`` runs the variant's j-th call (j = 0..calls-1; map j to an input yourself); ``setup()`` runs
    before each block of the variant's calls (e.g. to set the thread count); it is not timed.
    """

    name: str
    call: Callable[[int], Any]
    calls: int
    items_per_call: int = 1
    setup: Callable[[], None] | None = None


def interleave(arms: Sequence[Arm], rounds: int, warmup: int = 0, clock: Clock | None = None) -> list[VariantTiming]:
    """Time every arm's calls in ``rounds`` rounds, rotating the order (A B C, B C A, C A B, ...).

    Each arm's ``calls`` are split evenly over the rounds (round r runs calls r*calls//rounds up to
    (r+1)*calls//rounds), so every arm sees the same inputs in the same rounds. ``warmup`` untimed calls
    per arm (j = 0..warmup-1) come first.
    """
    if not arms:
        raise LatencyLabError("interleave needs at least one arm")
    if len({a.name for a in arms}) != len(arms):
        raise LatencyLabError("arm names must be unique")
    if rounds < 1:
        raise LatencyLabError(f"rounds must be >= 1, got {rounds}")
    for a in arms:
        if a.calls < rounds:
            raise LatencyLabError(f"arm {a.name!r}: {a.calls} calls cannot fill {rounds} rounds")
    clk = clock or PerfCounterClock()
    mark, resolve = clk.mark, clk.resolve
    for a in arms:
        if a.setup is not None:
            a.setup()
        for j in range(warmup):
            a.call(j)
    samples: dict[str, list[int]] = {a.name: [] for a in arms}
    n = len(arms)
    for r in range(rounds):
        for a in [*arms[r % n :], *arms[: r % n]]:
            if a.setup is not None:
                a.setup()
            out = samples[a.name]
            call = a.call
            for j in range(r * a.calls // rounds, (r + 1) * a.calls // rounds):
                m0 = mark()
                call(j)
                m1 = mark()
                t0, t1 = resolve([m0, m1])
                out.append(int(t1) - int(t0))
    return [VariantTiming(a.name, a.items_per_call, tuple(samples[a.name])) for a in arms]


class _Threads:
    """Set torch's intra-op thread count (if torch is imported) and restore it afterwards."""

    def __init__(self) -> None:
        self.torch: Any = sys.modules.get("torch")
        self.saved = self.torch.get_num_threads() if self.torch is not None else None

    def set(self, n: int | None) -> None:
        if n is not None and self.torch is not None and self.torch.get_num_threads() != n:
            self.torch.set_num_threads(n)

    def restore(self) -> None:
        self.set(self.saved)


def _fingerprint(env: Mapping[str, Any] | None) -> dict[str, Any]:
    if env is not None:
        return dict(env)
    from latencylab.env import fingerprint

    return fingerprint()


def _ms(ns: float) -> float:
    return ns / 1e6


# ================================================================== 1. shape policy (text)


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """One padding policy: its timing and the work it did.

    ``tokens_processed`` counts every position the encoder ran over (batch x padded length, summed);
    ``tokens_real`` the positions holding real tokens. ``waste`` = padded tokens per real token.
    ``shapes`` are the distinct padded lengths seen (each is a recompile for a static-shape compiler, or an
    optimisation profile for TensorRT). ``cos_min``/``cos_mean``: cosine of each item's embedding with the
    exact policy's.
    """

    name: str
    timing: VariantTiming
    tokens_processed: int
    tokens_real: int
    shapes: tuple[int, ...]
    cos_min: float
    cos_mean: float

    @property
    def waste(self) -> float:
        return (self.tokens_processed - self.tokens_real) / self.tokens_real

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "timing": self.timing.to_dict(),
            "tokens_processed": self.tokens_processed,
            "tokens_real": self.tokens_real,
            "padded_per_real_token": self.waste,
            "shapes": list(self.shapes),
            "cos_min_vs_exact": self.cos_min,
            "cos_mean_vs_exact": self.cos_mean,
        }


@dataclass(frozen=True, slots=True)
class ShapePolicyResult:
    """``shape_policy`` at one batch size: fixed, exact and bucketed padding over the real corpus."""

    batch_size: int
    threads: int | None
    max_length: int
    n_items: int
    rounds: int
    bucket_edges: tuple[int, ...]
    bucket_method: str
    coverage: float
    bucket_fit: float  # fraction of padded shapes that fit the largest non-max bucket
    policies: tuple[PolicyOutcome, ...]
    embeddings_match: bool
    min_cos: float
    winner: str
    conclusion: str
    env: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "shape-policy"

    def policy(self, name: str) -> PolicyOutcome:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "max_length": self.max_length,
            "n_items": self.n_items,
            "rounds": self.rounds,
            "bucket_edges": list(self.bucket_edges),
            "bucket_method": self.bucket_method,
            "coverage": self.coverage,
            "bucket_fit": self.bucket_fit,
            "policies": [p.to_dict() for p in self.policies],
            "embeddings_match": self.embeddings_match,
            "min_cos": self.min_cos,
            "winner": self.winner,
            "conclusion": self.conclusion,
            "env": dict(self.env),
        }


def shape_policy(
    texts: Sequence[str] | None = None,
    tokenizer: Any = None,
    model: Any = None,
    *,
    batch_size: int = 1,
    max_length: int = 256,
    coverage: float = 0.95,
    k: int = 3,
    method: str = "min-waste",
    rounds: int = 10,
    warmup: int = 2,
    threads: int | None = 1,
    min_cos: float = 0.9999,
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
) -> ShapePolicyResult:
    """Compare padding policies for the text workload over real inputs (default: the shipped corpus).

    The inputs are cut into consecutive batches of ``batch_size`` (the workload's own order; a last,
    incomplete batch is dropped so every call has the same size). Each policy's call tokenises its batch
    (truncating to ``max_length``, padding to the longest), pads the tensors further to the policy's length
    (pad id / zero attention mask), runs the encoder and mean-pools over the attention mask:

    * ``fixed-<max_length>``: always ``max_length`` (one static shape);
    * ``exact``: the longest in the batch (no extra padding; a new shape per length);
    * ``buckets``: the smallest bucket edge >= the longest, else ``max_length``; the edges come from
      :func:`choose_buckets` over the *padded shapes the policy would see* (at batch 1 the input lengths,
      at batch b the longest of each batch), covering ``coverage`` of them.

    Every policy runs every batch once, interleaved in ``rounds`` rounds. Padding with a correct attention
    mask must not change the result: each item's embedding is compared with the exact policy's
    (``embeddings_match`` is True when every cosine >= ``min_cos``).
    """
    torch: Any = require("torch", "text")
    from latencylab.workloads import text as text_wl

    if batch_size < 1:
        raise LatencyLabError(f"batch size must be >= 1, got {batch_size}")
    if tokenizer is None or model is None:
        tokenizer, model = text_wl.load_model()
    items = list(texts) if texts is not None else list(text_wl.corpus())
    n_batches = len(items) // batch_size
    if n_batches < rounds:
        raise LatencyLabError(
            f"{len(items)} texts make {n_batches} batches of {batch_size}: fewer than {rounds} rounds"
        )
    batches = [items[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]
    pad_id = int(tokenizer.pad_token_id or 0)

    def tokenize(batch: list[str]) -> Any:
        return tokenizer(batch, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")

    encs = [tokenize(b) for b in batches]  # untimed: lengths and real-token counts
    widths = [int(e["input_ids"].shape[1]) for e in encs]
    real = [int(e["attention_mask"].sum()) for e in encs]
    edges = [e for e in choose_buckets(widths, coverage, k, method) if e < max_length]
    fit = sum(w <= edges[-1] for w in widths) / len(widths) if edges else 0.0
    targets: dict[str, list[int]] = {
        f"fixed-{max_length}": [max_length] * n_batches,
        "exact": widths,
        "buckets": [bucket_for(w, edges, max_length) for w in widths],
    }
    outputs: dict[str, dict[int, np.ndarray]] = {name: {} for name in targets}
    functional = torch.nn.functional

    def make_call(name: str) -> Callable[[int], Any]:
        tgt, store = targets[name], outputs[name]

        def call(j: int) -> Any:
            enc = tokenize(batches[j])
            w = enc["input_ids"].shape[1]
            extra = tgt[j] - w
            feed = (
                {
                    key: functional.pad(v, (0, extra), value=pad_id if key == "input_ids" else 0)
                    for key, v in enc.items()
                }
                if extra > 0
                else dict(enc)
            )
            with torch.inference_mode():
                out = model(**feed)
                emb = text_wl.mean_pool_normalize(out.last_hidden_state, feed["attention_mask"])
            store.setdefault(j, emb.numpy())
            return emb

        return call

    th = _Threads()
    try:
        th.set(threads)
        arms = [Arm(name, make_call(name), n_batches, batch_size) for name in targets]
        timings = interleave(arms, rounds, warmup, clock)
    finally:
        th.restore()

    ref = np.concatenate([outputs["exact"][j] for j in range(n_batches)])
    policies = []
    for timing in timings:
        got = np.concatenate([outputs[timing.name][j] for j in range(n_batches)])
        cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        tgt = targets[timing.name]
        policies.append(
            PolicyOutcome(
                name=timing.name,
                timing=timing,
                tokens_processed=sum(t * batch_size for t in tgt),
                tokens_real=sum(real),
                shapes=tuple(sorted(set(tgt))),
                cos_min=float(cos.min()),
                cos_mean=float(cos.mean()),
            )
        )
    match = all(p.cos_min >= min_cos for p in policies)
    winner, conclusion = _shape_conclusion(policies, batch_size, edges, max_length, match, min_cos)
    return ShapePolicyResult(
        batch_size=batch_size,
        threads=threads,
        max_length=max_length,
        n_items=n_batches * batch_size,
        rounds=rounds,
        bucket_edges=tuple(edges),
        bucket_method=method,
        coverage=coverage,
        bucket_fit=fit,
        policies=tuple(policies),
        embeddings_match=match,
        min_cos=min_cos,
        winner=winner,
        conclusion=conclusion,
        env=_fingerprint(env),
    )


def _shape_conclusion(
    policies: Sequence[PolicyOutcome],
    batch_size: int,
    edges: Sequence[int],
    max_length: int,
    match: bool,
    min_cos: float,
) -> tuple[str, str]:
    by_mean = sorted(policies, key=lambda p: p.timing.summary().mean)
    best, worst = by_mean[0], by_mean[-1]
    bs, ws = best.timing.summary(), worst.timing.summary()
    parts = [
        f"batch {batch_size}: {best.name} is fastest at {bs.mean:.2f} ms per item (mean; p50 {bs.median:.2f}), "
        f"{ws.mean / bs.mean:.1f}x faster than {worst.name} ({ws.mean:.2f} ms).",
        "Padded tokens per real token: "
        + ", ".join(f"{p.name} {p.waste:.2f}" for p in policies)
        + f" (buckets at {list(edges)} + {max_length}).",
        "The encoder's cost grows with the padded length (linear layers linearly, attention quadratically) and "
        "padding is computed and then masked away, so the policy that pads least does least work: the fastest "
        "work is the work not done.",
    ]
    if len(by_mean) > 1:
        second = by_mean[1]
        b50, s50 = bs.at(0.5), second.timing.summary().at(0.5)
        separated = b50.ci_high < s50.ci_low
        parts.append(
            f"Against the runner-up {second.name} the p50 CIs "
            + ("do not overlap." if separated else "overlap: the difference is within the noise.")
        )
    exact = next((p for p in policies if p.name == "exact"), None)
    if exact is not None:
        parts.append(
            f"Exact shapes use {len(exact.shapes)} distinct lengths, buckets "
            f"{len(next((p.shapes for p in policies if p.name == 'buckets'), ()))}: on eager CPU a new shape costs "
            "nothing, for a static-shape compiler (TensorRT profiles, torch.compile without dynamic shapes) "
            "buckets bound the number of engines/recompiles while keeping most of the saving."
        )
    if not match:
        parts.append(f"WARNING: some embeddings differ from the exact policy's (cosine < {min_cos}).")
    return best.name, " ".join(parts)


# ================================================================== 2. pipeline overlap (vision)


@dataclass(frozen=True, slots=True)
class OverlapMode:
    """One way of running the pipeline over the same items, ``rounds`` times.

    ``wall_ns[r]``: time to process all items in round r. Per item (all rounds, in order):
    ``latency_ns`` from the moment the pipeline took the input (it was available) to its result,
    ``prepare_ns`` decode + preprocess, ``infer_ns`` forward + postprocess, ``wait_ns`` time between the
    input being prepared and the model starting on it (the bounded queue; 0 when serial).
    """

    name: str
    threads: int | None
    n_items: int
    wall_ns: tuple[int, ...]
    latency_ns: tuple[int, ...]
    prepare_ns: tuple[int, ...]
    infer_ns: tuple[int, ...]
    wait_ns: tuple[int, ...]

    @property
    def items_per_s(self) -> float:
        """All items over all rounds' wall time (one preempted round drags it down; see ``items_per_s_p50``)."""
        return self.n_items * len(self.wall_ns) / (sum(self.wall_ns) / 1e9)

    @property
    def items_per_s_p50(self) -> float:
        """Median over rounds of the round's throughput (robust to a round hit by another process)."""
        return float(np.median(self.round_items_per_s()))

    def round_items_per_s(self) -> np.ndarray:
        return self.n_items / (np.asarray(self.wall_ns, dtype=np.float64) / 1e9)

    def latency_summary(self) -> stats.Summary:
        return stats.summarize(np.asarray(self.latency_ns, dtype=np.float64) / 1e6, qs=(0.5, 0.99), label=self.name)

    def to_dict(self) -> dict[str, Any]:
        lat = self.latency_summary()
        p50, p99 = lat.at(0.5), lat.at(0.99)
        tput = stats.summarize(self.round_items_per_s(), qs=(0.5,), label=f"{self.name} items/s")
        return {
            "name": self.name,
            "threads": self.threads,
            "n_items": self.n_items,
            "rounds": len(self.wall_ns),
            "items_per_s": self.items_per_s,
            "items_per_s_p50_over_rounds": self.items_per_s_p50,
            "items_per_s_p50_ci": [tput.at(0.5).ci_low, tput.at(0.5).ci_high],
            "latency_ms": {
                "mean": lat.mean,
                "p50": p50.value,
                "p50_ci": [p50.ci_low, p50.ci_high],
                "p99": p99.value,
                "p99_ci": [p99.ci_low, p99.ci_high],
            },
            "prepare_ms_p50": float(np.median(self.prepare_ns)) / 1e6,
            "infer_ms_p50": float(np.median(self.infer_ns)) / 1e6,
            "wait_ms_p50": float(np.median(self.wait_ns)) / 1e6,
            "warnings": list(lat.warnings),
            "wall_ns": list(self.wall_ns),
            "latency_ns": list(self.latency_ns),
            "prepare_ns": list(self.prepare_ns),
            "infer_ns": list(self.infer_ns),
            "wait_ns": list(self.wait_ns),
        }


@dataclass(frozen=True, slots=True)
class OverlapResult:
    """Serial against double-buffered execution of the same pipeline over the same items."""

    label: str
    n_items: int
    rounds: int
    threads: int | None
    queue_size: int
    modes: tuple[OverlapMode, ...]
    speedup: float  # median over rounds of overlap items/s / serial items/s (paired within a round)
    speedup_by_round: tuple[float, ...]
    ideal_speedup: float  # (prepare + infer) / max(prepare, infer), from the serial medians
    outputs_match: bool | None
    conclusion: str
    env: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "pipeline-overlap"

    def mode(self, name: str) -> OverlapMode:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "label": self.label,
            "n_items": self.n_items,
            "rounds": self.rounds,
            "threads": self.threads,
            "queue_size": self.queue_size,
            "modes": [m.to_dict() for m in self.modes],
            "speedup": self.speedup,
            "speedup_by_round": list(self.speedup_by_round),
            "ideal_speedup": self.ideal_speedup,
            "outputs_match": self.outputs_match,
            "conclusion": self.conclusion,
            "env": dict(self.env),
        }


_DONE = object()


def _run_serial(
    items: Sequence[Any], prepare: Callable[[Any], Any], infer: Callable[[Any], Any], clk: Clock
) -> tuple[int, list[tuple[int, int, int, int]], list[Any]]:
    rows: list[tuple[int, int, int, int]] = []
    outs: list[Any] = []
    mark, resolve = clk.mark, clk.resolve
    start = mark()
    for item in items:
        m0 = mark()
        x = prepare(item)
        m1 = mark()
        outs.append(infer(x))
        m2 = mark()
        t0, t1, t2 = (int(t) for t in resolve([m0, m1, m2]))
        rows.append((t2 - t0, t1 - t0, t2 - t1, 0))
    end = mark()
    s, e = resolve([start, end])
    return int(e) - int(s), rows, outs


def _run_overlapped(
    items: Sequence[Any],
    prepare: Callable[[Any], Any],
    infer: Callable[[Any], Any],
    clk: Clock,
    queue_size: int,
) -> tuple[int, list[tuple[int, int, int, int]], list[Any]]:
    """A producer thread prepares inputs into a bounded queue while this thread runs the model."""
    mark, resolve = clk.mark, clk.resolve
    n = len(items)
    taken: list[Any] = [None] * n
    prepared: list[Any] = [None] * n
    q: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
    stop = threading.Event()
    errors: list[BaseException] = []

    def put(obj: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(obj, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def producer() -> None:
        try:
            for i, item in enumerate(items):
                if stop.is_set():
                    return
                taken[i] = mark()
                x = prepare(item)
                prepared[i] = mark()
                if not put((i, x)):
                    return
        except BaseException as exc:  # handed to the consumer, re-raised there
            errors.append(exc)
        finally:
            put(_DONE)

    rows: list[tuple[int, int, int, int]] = []
    outs: list[Any] = []
    start = mark()
    worker = threading.Thread(target=producer, name="latencylab-prepare", daemon=True)
    worker.start()
    try:
        while True:
            got = q.get()
            if got is _DONE:
                break
            i, x = got
            m_start = mark()
            outs.append(infer(x))
            m_done = mark()
            t_take, t_prep, t_start, t_done = (int(t) for t in resolve([taken[i], prepared[i], m_start, m_done]))
            rows.append((t_done - t_take, t_prep - t_take, t_done - t_start, t_start - t_prep))
    finally:
        stop.set()
        worker.join()
    end = mark()
    if errors:
        raise errors[0]
    if len(rows) != n:
        raise LatencyLabError(f"overlapped run produced {len(rows)} results for {n} inputs")
    s, e = resolve([start, end])
    return int(e) - int(s), rows, outs


def _same_outputs(a: Sequence[Any], b: Sequence[Any]) -> bool | None:
    """Whether two runs' outputs agree (numpy-able outputs only; None when they cannot be compared)."""
    if len(a) != len(b):
        return False
    try:
        for x, y in zip(a, b, strict=True):
            xa, ya = _as_numpy(x), _as_numpy(y)
            if xa.shape != ya.shape or not np.allclose(xa, ya, rtol=1e-5, atol=1e-6):
                return False
    except (TypeError, ValueError):
        return None
    return True


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "probs"):  # vision Predictions
        x = x.probs
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError("not a numeric output")
    return arr


def pipeline_overlap(
    items: Sequence[Any],
    prepare: Callable[[Any], Any],
    infer: Callable[[Any], Any],
    *,
    rounds: int = 5,
    warmup: int = 5,
    threads: int | None = 1,
    queue_size: int = 2,
    reference_threads: int | None = None,
    label: str = "",
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
) -> OverlapResult:
    """Serial against double-buffered (asynchronous data path) execution over the same ``items``.

    * ``serial``: for each item, ``infer(prepare(item))``, one after the other;
    * ``overlap``: a producer thread runs ``prepare`` on item i+1 (and up to ``queue_size`` ahead, through
      a bounded queue) while this thread runs ``infer`` on item i.

    Both at ``threads`` torch intra-op threads (default 1, so that the two stages can each have a core);
    ``reference_threads`` adds ``serial-<n>t``, the serial pipeline with n torch threads (is overlap better
    than giving the model the cores?). Each round runs every mode over all items, in rotated order.

    Latency of an item runs from when the pipeline takes the input (it is available: in a saturated
    stream, the moment the previous one's preparation ends) to its result, so queue waits are charged to
    the overlapped mode. Throughput is items / wall time of the round.
    """
    if not items:
        raise LatencyLabError("pipeline_overlap needs at least one item")
    if rounds < 1 or queue_size < 1 or warmup < 0:
        raise LatencyLabError("rounds and queue_size must be >= 1, warmup >= 0")
    clk = clock or PerfCounterClock()
    modes: list[tuple[str, int | None, bool]] = [("serial", threads, False), ("overlap", threads, True)]
    if reference_threads is not None and reference_threads != threads:
        modes.append((f"serial-{reference_threads}t", reference_threads, False))
    th = _Threads()
    walls: dict[str, list[int]] = {m[0]: [] for m in modes}
    rows: dict[str, list[tuple[int, int, int, int]]] = {m[0]: [] for m in modes}
    first_outs: dict[str, list[Any]] = {}
    warm = [items[i % len(items)] for i in range(warmup)]
    try:
        for _, t, overlapped in modes:
            th.set(t)
            if not warm:
                continue
            # The overlapped warm-up goes through the producer thread too (first concurrent use of the libraries).
            if overlapped:
                _run_overlapped(warm, prepare, infer, clk, queue_size)
            else:
                _run_serial(warm, prepare, infer, clk)
        for r in range(rounds):
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for name, t, overlapped in order:
                th.set(t)
                if overlapped:
                    wall, rr, outs = _run_overlapped(items, prepare, infer, clk, queue_size)
                else:
                    wall, rr, outs = _run_serial(items, prepare, infer, clk)
                walls[name].append(wall)
                rows[name].extend(rr)
                first_outs.setdefault(name, outs)
    finally:
        th.restore()
    results = tuple(
        OverlapMode(
            name=name,
            threads=t,
            n_items=len(items),
            wall_ns=tuple(walls[name]),
            latency_ns=tuple(x[0] for x in rows[name]),
            prepare_ns=tuple(x[1] for x in rows[name]),
            infer_ns=tuple(x[2] for x in rows[name]),
            wait_ns=tuple(x[3] for x in rows[name]),
        )
        for name, t, _ in modes
    )
    serial, overlap = results[0], results[1]
    by_round = tuple(float(s / o) for s, o in zip(serial.wall_ns, overlap.wall_ns, strict=True))
    speedup = float(np.median(by_round))
    prep, inf = float(np.median(serial.prepare_ns)), float(np.median(serial.infer_ns))
    ideal = (prep + inf) / max(prep, inf) if max(prep, inf) > 0 else 1.0
    match = _same_outputs(first_outs["serial"], first_outs["overlap"])
    conclusion = _overlap_conclusion(results, speedup, by_round, ideal, prep, inf, queue_size)
    return OverlapResult(
        label=label,
        n_items=len(items),
        rounds=rounds,
        threads=threads,
        queue_size=queue_size,
        modes=results,
        speedup=speedup,
        speedup_by_round=by_round,
        ideal_speedup=ideal,
        outputs_match=match,
        conclusion=conclusion,
        env=_fingerprint(env),
    )


def _overlap_conclusion(
    modes: Sequence[OverlapMode],
    speedup: float,
    by_round: Sequence[float],
    ideal: float,
    prep_ns: float,
    infer_ns: float,
    queue_size: int,
) -> str:
    serial, overlap = modes[0], modes[1]
    sl, ol = serial.latency_summary(), overlap.latency_summary()
    bottleneck = "prepare (decode + preprocess)" if prep_ns >= infer_ns else "infer (forward + postprocess)"
    parts = [
        f"Throughput (median over rounds): serial {serial.items_per_s_p50:.1f} items/s, overlapped "
        f"{overlap.items_per_s_p50:.1f} items/s; speed-up x{speedup:.2f} (median of {len(by_round)} paired rounds, "
        f"range {min(by_round):.2f}-{max(by_round):.2f}).",
        f"Serial stage medians: prepare {_ms(prep_ns):.2f} ms, infer {_ms(infer_ns):.2f} ms; perfect overlap would "
        f"give x{ideal:.2f} (the slower stage, {bottleneck}, sets the pace).",
        f"Per-item latency p50: serial {sl.median:.2f} ms, overlapped {ol.median:.2f} ms (p99 {sl.at(0.99).value:.2f} "
        f"vs {ol.at(0.99).value:.2f}). Overlap does not shorten one item's own path; under a saturated stream "
        f"the prepared items wait in the queue of {queue_size} "
        f"(median wait {_ms(float(np.median(overlap.wait_ns))):.2f} ms), and what it buys is capacity: "
        "a stream arriving faster than the serial pipeline's rate queues without bound serially but not here.",
        "Threads suffice (no processes) because the heavy parts release the GIL: Pillow's JPEG decoder and "
        "resize, numpy's array arithmetic and torch's kernels run without it; only the Python glue between "
        "them contends, which is why the achieved speed-up stays below the ideal.",
    ]
    if len(modes) > 2:
        ref = modes[2]
        parts.append(
            f"Reference {ref.name} (serial, model on {ref.threads} threads): {ref.items_per_s_p50:.1f} items/s, "
            f"x{ref.items_per_s_p50 / serial.items_per_s_p50:.2f} over serial: "
            + (
                "overlap uses the second core better than intra-op threads do."
                if overlap.items_per_s_p50 > ref.items_per_s_p50
                else "giving the model both cores does as well or better here."
            )
        )
    return " ".join(parts)


# ================================================================== 3. thread and batch sweeps


@dataclass(frozen=True, slots=True)
class SweepPoint:
    value: int  # the thread count or batch size
    timing: VariantTiming

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, **self.timing.to_dict()}


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Per-item latency and throughput per setting of one knob (``threads`` or ``batch``)."""

    label: str
    knob: str  # "threads" | "batch"
    fixed: Mapping[str, Any]  # the other settings held constant (threads for a batch sweep, batch for threads)
    rounds: int
    points: tuple[SweepPoint, ...]
    best: int  # the setting with the highest throughput
    non_monotonic: tuple[str, ...]  # batch sweeps: point estimates (p50), see non_monotonic()
    non_monotonic_significant: tuple[str, ...]  # ... and only where the p50 CIs do not overlap
    env: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "sweep"

    def throughputs(self) -> dict[int, float]:
        """Items/s per setting from the p50 per-item latency (robust to the odd preempted call)."""
        return {p.value: 1e3 / p.timing.summary().median for p in self.points}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "label": self.label,
            "knob": self.knob,
            "fixed": dict(self.fixed),
            "rounds": self.rounds,
            "points": [p.to_dict() for p in self.points],
            "items_per_s_from_p50": {str(k): v for k, v in self.throughputs().items()},
            "best": self.best,
            "non_monotonic": list(self.non_monotonic),
            "non_monotonic_significant": list(self.non_monotonic_significant),
            "env": dict(self.env),
        }


def _sweep_result(
    label: str, knob: str, fixed: Mapping[str, Any], rounds: int, points: Sequence[SweepPoint], env: Any
) -> SweepResult:
    tput = {p.value: 1e3 / p.timing.summary().median for p in points}
    flags: list[str] = []
    strict: list[str] = []
    if knob == "batch":
        flags = non_monotonic(tput)
        # Significant: the larger batch's best case (p50 CI low -> highest throughput) is still below a smaller
        # batch's worst case.
        hi = {p.value: 1e3 / p.timing.summary().at(0.5).ci_low for p in points}
        lo = {p.value: 1e3 / p.timing.summary().at(0.5).ci_high for p in points}
        for b in sorted(tput):
            worse = [s for s in sorted(tput) if s < b and hi[b] < lo[s]]
            if worse:
                s = max(worse, key=lambda v: lo[v])
                strict.append(
                    f"batch {b}: at most {hi[b]:.4g} items/s, below batch {s}'s at least {lo[s]:.4g} (p50 95% CIs)"
                )
    best = max(tput, key=lambda v: tput[v])
    return SweepResult(label, knob, dict(fixed), rounds, tuple(points), best, tuple(flags), tuple(strict), env)


def thread_sweep(
    run_fn: Callable[[], Any],
    threads: Sequence[int] | None = None,
    *,
    items_per_call: int = 1,
    rounds: int = 5,
    calls_per_round: int = 10,
    warmup: int = 3,
    label: str = "",
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
) -> SweepResult:
    """Time ``run_fn()`` (which handles ``items_per_call`` items) at each torch intra-op thread count.

    ``threads`` defaults to 1..os.cpu_count(). The counts take turns in rotated rounds; torch's setting is
    restored afterwards.
    """
    require("torch", "torch")
    counts = list(threads) if threads is not None else list(range(1, (os.cpu_count() or 1) + 1))
    if not counts or any(t < 1 for t in counts):
        raise LatencyLabError(f"thread counts must be >= 1, got {counts}")
    th = _Threads()

    def setter(t: int) -> Callable[[], None]:
        return lambda: th.set(t)

    arms = [
        Arm(f"threads={t}", lambda j: run_fn(), rounds * calls_per_round, items_per_call, setter(t)) for t in counts
    ]
    try:
        timings = interleave(arms, rounds, warmup, clock)
    finally:
        th.restore()
    points = [SweepPoint(t, tm) for t, tm in zip(counts, timings, strict=True)]
    return _sweep_result(label, "threads", {"items_per_call": items_per_call}, rounds, points, _fingerprint(env))


def batch_sweep(
    make_run: Callable[[int], Callable[[], Any]],
    batches: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    threads: int | None = 1,
    rounds: int = 5,
    items_per_round: int = 32,
    warmup: int = 2,
    label: str = "",
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
) -> SweepResult:
    """Time ``make_run(b)()`` (one call handles a batch of b items) at each batch size b.

    Each round gives every batch size about ``items_per_round`` items (max(1, items_per_round // b) calls),
    so large batches do not dominate the round's time; the order rotates every round. Flags batch sizes
    slower per item than a smaller one (:func:`non_monotonic`).
    """
    sizes = list(batches)
    if not sizes or any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise LatencyLabError(f"batch sizes must be distinct and >= 1, got {sizes}")
    fns = {b: make_run(b) for b in sizes}
    th = _Threads()

    def caller(b: int) -> Callable[[int], Any]:
        fn = fns[b]
        return lambda j: fn()

    arms = [Arm(f"batch={b}", caller(b), rounds * max(1, items_per_round // b), b) for b in sizes]
    try:
        th.set(threads)
        timings = interleave(arms, rounds, warmup, clock)
    finally:
        th.restore()
    points = [SweepPoint(b, tm) for b, tm in zip(sizes, timings, strict=True)]
    return _sweep_result(label, "batch", {"threads": threads}, rounds, points, _fingerprint(env))


# ================================================================== workload helpers


def text_forward_fn(tokenizer: Any, model: Any, batch_size: int, seq_len: int = 128) -> Callable[[], Any]:
    """A call running MiniLM forward + mean pool on ``batch_size`` corpus texts padded/truncated to ``seq_len``.

    The input is tokenised once, outside the call: the call times the model (fixed shape batch x seq_len).
    """
    import torch

    from latencylab.workloads import text as text_wl

    texts = text_wl.corpus()
    # Passages long enough to fill seq_len where possible, so the tokens are real text rather than padding.
    longest = sorted(texts, key=len, reverse=True)
    batch = [longest[i % len(longest)] for i in range(batch_size)]
    enc = tokenizer(batch, padding="max_length", truncation=True, max_length=seq_len, return_tensors="pt")
    feed = dict(enc)

    def run() -> Any:
        with torch.inference_mode():
            out = model(**feed)
            return text_wl.mean_pool_normalize(out.last_hidden_state, feed["attention_mask"])

    return run


def vision_stages(model: Any, res: int = 64) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(prepare, infer) for the vision workload: decode + preprocess, forward + postprocess."""
    from latencylab.workloads import vision

    pre = vision.Preprocess(res)
    fwd = vision.Forward(model.eval())

    def prepare(jpeg: bytes) -> Any:
        return pre(vision.decode(jpeg))

    def infer(x: Any) -> Any:
        return vision.postprocess(fwd(x))

    return prepare, infer


def vision_forward_fn(model: Any, jpegs: Sequence[bytes], batch_size: int, res: int = 64) -> Callable[[], Any]:
    """A call running the vision CNN forward on ``batch_size`` decoded, preprocessed images (prepared once)."""
    from latencylab.workloads import vision

    x = vision.Preprocess(res)(vision.decode([jpegs[i % len(jpegs)] for i in range(batch_size)]))
    fwd = vision.Forward(model.eval())
    return lambda: fwd(x)


# ================================================================== report / CLI


def format_shape(r: ShapePolicyResult) -> str:
    lines = [
        f"shape policy, text, batch {r.batch_size}, {r.n_items} items, threads {r.threads}, "
        f"buckets {list(r.bucket_edges)} + {r.max_length} ({r.bucket_method}, {r.bucket_fit:.0%} fit)",
        f"{'policy':<12} {'mean ms':>8} {'p50 ms':>8} {'p50 95% CI':>17} {'p99 ms':>8} "
        f"{'items/s':>8} {'pad/real':>8} {'shapes':>6} {'cos min':>9}",
    ]
    for p in r.policies:
        s = p.timing.summary()
        a50, a99 = s.at(0.5), s.at(0.99)
        lines.append(
            f"{p.name:<12} {s.mean:8.2f} {a50.value:8.2f} {f'[{a50.ci_low:.2f}, {a50.ci_high:.2f}]':>17} "
            f"{a99.value:8.2f} {p.timing.items_per_s:8.1f} {p.waste:8.2f} {len(p.shapes):6d} {p.cos_min:9.6f}"
        )
    lines.append(r.conclusion)
    return "\n".join(lines)


def format_overlap(r: OverlapResult) -> str:
    lines = [
        f"pipeline overlap, {r.label or 'pipeline'}, {r.n_items} items x {r.rounds} rounds, "
        f"queue {r.queue_size}, outputs match: {r.outputs_match}",
        f"{'mode':<12} {'thr':>3} {'items/s':>8} {'(all)':>8} {'lat p50':>8} {'p50 95% CI':>17} {'lat p99':>8} "
        f"{'prep p50':>8} {'infer p50':>9} {'wait p50':>8}",
    ]
    for m in r.modes:
        s = m.latency_summary()
        a50 = s.at(0.5)
        lines.append(
            f"{m.name:<12} {m.threads!s:>3} {m.items_per_s_p50:8.1f} {m.items_per_s:8.1f} {a50.value:8.2f} "
            f"{f'[{a50.ci_low:.2f}, {a50.ci_high:.2f}]':>17} {s.at(0.99).value:8.2f} "
            f"{_ms(float(np.median(m.prepare_ns))):8.2f} {_ms(float(np.median(m.infer_ns))):9.2f} "
            f"{_ms(float(np.median(m.wait_ns))):8.2f}"
        )
    lines.append(r.conclusion)
    return "\n".join(lines)


def format_sweep(r: SweepResult) -> str:
    lines = [
        f"{r.knob} sweep, {r.label}, fixed {dict(r.fixed)}, {r.rounds} rounds",
        f"{r.knob:>7} {'call p50 ms':>11} {'item mean':>9} {'item p50':>9} {'p50 95% CI':>17} {'item p99':>9} "
        f"{'items/s':>8}",
    ]
    tput = r.throughputs()
    for p in r.points:
        s = p.timing.summary()
        a50 = s.at(0.5)
        lines.append(
            f"{p.value:>7} {float(np.median(p.timing.samples_ns)) / 1e6:11.2f} {s.mean:9.3f} {a50.value:9.3f} "
            f"{f'[{a50.ci_low:.3f}, {a50.ci_high:.3f}]':>17} {s.at(0.99).value:9.3f} {tput[p.value]:8.1f}"
        )
    lines.append(f"best: {r.knob} {r.best}")
    for f in r.non_monotonic:
        lines.append(f"non-monotonic: {f}")
    for f in r.non_monotonic_significant:
        lines.append(f"non-monotonic (CIs separate): {f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the experiments on the built-in workloads; print the tables, optionally save JSON."""
    ap = argparse.ArgumentParser(prog="python -m latencylab.optimize.experiments", description=__doc__)
    ap.add_argument("--only", choices=("shapes", "overlap", "threads", "batch"), action="append")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--quick", action="store_true", help="fewer items and rounds (a smoke run)")
    args = ap.parse_args(argv)
    which = set(args.only or ("shapes", "overlap", "threads", "batch"))
    quick = bool(args.quick)
    env = _fingerprint(None)
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
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

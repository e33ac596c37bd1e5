"""Shape policy (text): pad to a fixed maximum, exactly (to the batch's longest), or to a few length buckets.

Reports latency per item, padded tokens per real token and whether the embeddings stay equal to the exact
policy's. Settings: :class:`ShapePolicyConfig`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError, require
from latencylab.optimize.buckets import bucket_for, choose_buckets
from latencylab.results.base import utc_now
from latencylab.results.experiment import experiment_doc
from latencylab.results.registry import SCHEMA_VERSION
from latencylab.threads import TorchThreads
from latencylab.timing import Arm, VariantTiming, env_or_fingerprint, interleave


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
        return experiment_doc(self, policies=[p.to_dict() for p in self.policies])


@dataclass(frozen=True, slots=True)
class ShapePolicyConfig:
    """Settings of :func:`shape_policy` (each field's ``help`` says what it sets)."""

    batch_size: int = field(default=1, metadata={"help": "inputs per call"})
    max_length: int = field(default=256, metadata={"help": "the fixed policy pads to this many tokens"})
    coverage: float = field(default=0.95, metadata={"help": "fraction of inputs the largest bucket holds"})
    k: int = field(default=3, metadata={"help": "number of length buckets"})
    method: str = field(default="min-waste", metadata={"help": "bucket choice: min-waste or quantile"})
    rounds: int = field(default=10, metadata={"help": "interleaved rounds"})
    warmup: int = field(default=2, metadata={"help": "untimed calls per variant first"})
    threads: int | None = field(default=1, metadata={"help": "torch intra-op threads (None: leave as is)"})
    min_cos: float = field(
        default=0.9999, metadata={"help": "embeddings match when every cosine to exact padding is at least this"}
    )


def shape_policy(
    texts: Sequence[str] | None = None,
    tokenizer: Any = None,
    model: Any = None,
    config: ShapePolicyConfig | None = None,
    *,
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
    **settings: Any,
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
    cfg = dataclasses.replace(config or ShapePolicyConfig(), **settings)
    batch_size, max_length, coverage, k, method, rounds, warmup, threads, min_cos = (
        cfg.batch_size,
        cfg.max_length,
        cfg.coverage,
        cfg.k,
        cfg.method,
        cfg.rounds,
        cfg.warmup,
        cfg.threads,
        cfg.min_cos,
    )
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

    with TorchThreads(threads):
        arms = [Arm(name, make_call(name), n_batches, batch_size) for name in targets]
        timings = interleave(arms, rounds, warmup, clock)

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
        env=env_or_fingerprint(env),
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

"""What a scheduler step costs, learned online: prefill seconds per token and decode step seconds per batch size.

Both are seeded at warm-up (the server runs a few real requests before it listens) and then follow every
step with an EWMA. A single stall is clipped (``LatencyModel``'s rule: at most ``clip`` x the estimate), so one
hiccup does not make every later admission look infeasible.
"""

from __future__ import annotations

from latencylab.serve.admission import LatencyModel

__all__ = ["StepCosts"]


class StepCosts:
    """Prefill: seconds per prompt token (EWMA). Decode: seconds per step by batch size (``LatencyModel``).

    ``output_tokens``: the EWMA of how many tokens a finished sequence produced, as a fraction of its
    ``max_tokens`` (most replies end at EOS well before the limit); admission uses it to predict when a slot
    frees, so that it does not assume every reply runs to its limit.
    """

    def __init__(self, alpha: float = 0.2, clip: float = 4.0) -> None:
        self.alpha = alpha
        self.clip = clip
        self.prefill_per_token_s: float | None = None
        self.prefill_overhead_s = 0.0  # fixed cost of a prefill forward, besides its tokens (seeded at warm-up)
        self.decode = LatencyModel(alpha, clip)
        self.output_fraction = 1.0
        # a fused engine (genserve/packed.py) runs a step's chunks and decode batch in one forward: a chunk that
        # rides in a forward already paid for (the decode batch's, or an earlier chunk's) costs its tokens only
        self.fused = False

    def observe_prefill(self, tokens: int, seconds: float, fixed_s: float | None = None) -> None:
        """``seconds`` of a step's prefill work for ``tokens`` prompt tokens, of which ``fixed_s`` (default: the
        forward's fixed cost, ``prefill_overhead_s``) is not per token; a fused step passes its decode batch's
        predicted cost (the forward's fixed cost is in it)."""
        if tokens <= 0:
            return
        fixed = self.prefill_overhead_s if fixed_s is None else fixed_s
        per = max(0.0, seconds - fixed) / tokens
        old = self.prefill_per_token_s
        if old is not None:
            per = min(per, self.clip * old)
        self.prefill_per_token_s = per if old is None else old + self.alpha * (per - old)

    def fit_prefill(self, samples: list[tuple[int, float]]) -> None:
        """Seed the prefill cost from warm-up forwards (tokens, seconds) of two or more prompt lengths: a fixed
        cost per forward (the weights are read once whatever the chunk) plus a cost per token, from the median
        time of the shortest and the longest length. With one length, the per-token cost alone."""
        by_len: dict[int, list[float]] = {}
        for n, sec in samples:
            if n > 0:
                by_len.setdefault(n, []).append(sec)
        if not by_len:
            return
        med = {n: sorted(v)[len(v) // 2] for n, v in by_len.items()}
        lo, hi = min(med), max(med)
        slope = (med[hi] - med[lo]) / (hi - lo) if hi > lo else 0.0
        if slope <= 0:
            self.prefill_overhead_s, self.prefill_per_token_s = 0.0, med[hi] / hi
            return
        self.prefill_overhead_s = max(0.0, med[lo] - slope * lo)
        self.prefill_per_token_s = (med[hi] - self.prefill_overhead_s) / hi

    def observe_decode(self, batch: int, seconds: float) -> None:
        self.decode.observe(batch, seconds)

    def observe_finish(self, produced: int, max_tokens: int) -> None:
        if max_tokens > 0:
            self.output_fraction += self.alpha * (min(1.0, produced / max_tokens) - self.output_fraction)

    def prefill_s(self, tokens: int) -> float:
        if tokens <= 0 or self.prefill_per_token_s is None:
            return 0.0
        return self.prefill_overhead_s + tokens * self.prefill_per_token_s

    def chunk_s(self, tokens: int, shares_forward: bool) -> float:
        """A prefill chunk's cost within a step; ``shares_forward``: the step already runs a forward (its decode
        batch, or an earlier chunk) that a fused engine runs this chunk in (then no fixed cost)."""
        if self.fused and shares_forward:
            return 0.0 if tokens <= 0 or self.prefill_per_token_s is None else tokens * self.prefill_per_token_s
        return self.prefill_s(tokens)

    def decode_s(self, batch: int) -> float:
        return self.decode.predict(batch) if batch > 0 else 0.0

    @property
    def seeded(self) -> bool:
        return self.prefill_per_token_s is not None and bool(self.decode.by_size)

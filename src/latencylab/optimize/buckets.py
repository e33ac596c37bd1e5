"""Shape bucketing: choose a few padded lengths for inputs of varied lengths, and what padding costs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from latencylab.errors import LatencyLabError

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

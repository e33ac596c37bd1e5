"""Input shape policies: what a candidate does to the inputs before its model sees them.

A shape policy is a *pipeline* change, not a model change: it alters the work, so its gain is reported
apart from the model speedup (``summary.pipeline_speedup``, docs/metrics.md). Policies:

* ``as-given`` (the default; ``padded`` is its older recipe name): the inputs exactly as the user's
  pipeline declared them (``--param padding=...``), padding included;
* ``exact``: right padding trimmed by the attention mask, every input shaped like ``attention_mask`` cut
  to the last position any row attends to. Mask-preserving: the output equals the as-given run's up to
  float rounding, and the work on padding tokens is not done. On inputs without padding (natural lengths
  at batch 1) it is the same work as ``as-given``.

Every runner applies the policy through :func:`apply` and counts the positions it really ran with
:class:`TokenCounter`, so a torch and an ONNX Runtime candidate with the same policy provably see the
same shapes, and the roofline credits each variant with the work it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError

AS_GIVEN = "as-given"
EXACT = "exact"
POLICIES = (AS_GIVEN, EXACT)
_ALIASES = {"padded": AS_GIVEN}
MASK = "attention_mask"


def normalise(policy: str | None) -> str:
    """The canonical policy name (``None`` and ``padded`` mean ``as-given``)."""
    p = _ALIASES.get(str(policy), str(policy)) if policy is not None else AS_GIVEN
    if p not in POLICIES:
        raise LatencyLabError(f"unknown shape policy {policy!r}; one of {', '.join(POLICIES)}")
    return p


def trim_padding(feed: Mapping[str, np.ndarray], mask_name: str = MASK) -> dict[str, np.ndarray]:
    """The feed cut to the last sequence position any row's mask attends to (right padding removed)."""
    mask = feed.get(mask_name)
    if mask is None or mask.ndim != 2:
        return dict(feed)
    cols = np.flatnonzero(mask.any(axis=0))
    keep = int(cols[-1]) + 1 if cols.size else 1
    if keep == mask.shape[1]:
        return dict(feed)
    return {n: (a[:, :keep] if a.ndim >= 2 and a.shape[:2] == mask.shape else a) for n, a in feed.items()}


def apply(feed: Mapping[str, np.ndarray], policy: str) -> dict[str, np.ndarray]:
    """The inputs the model runs on under ``policy``."""
    return trim_padding(feed) if normalise(policy) == EXACT else dict(feed)


def has_padding(feeds: list[dict[str, np.ndarray]]) -> bool:
    """Whether any feed carries right padding that ``exact`` would trim."""
    return any(trim_padding(f).get(MASK, np.empty(0)).shape != np.shape(f.get(MASK, np.empty(0))) for f in feeds)


def exact_skip(ctx: Any) -> str | None:
    """Why shape policy ``exact`` is not worth a candidate on this BuildContext (shared by every family)."""
    if MASK not in ctx.adapter.input_names:
        return "shape policy 'exact' trims padding by the attention mask: this model has none"
    if not has_padding(ctx.all_feeds()):
        return "the inputs carry no padding (natural lengths): 'exact' is the same work as the inputs as given"
    return None


@dataclass(slots=True)
class TokenCounter:
    """Sequence positions a runner really ran (batch x length of its mask-shaped input), per call."""

    seq_lens: list[int] = field(default_factory=list)
    positions: int = 0
    calls: int = 0

    def count(self, feed: Mapping[str, np.ndarray]) -> None:
        mask = feed.get(MASK)
        if mask is None or np.ndim(mask) != 2:
            return
        b, s = (int(x) for x in np.shape(mask))
        self.seq_lens.append(s)
        self.positions += b * s
        self.calls += 1

    def reset(self) -> None:
        self.seq_lens.clear()
        self.positions = 0
        self.calls = 0

    def per_call(self) -> float | None:
        return self.positions / self.calls if self.calls else None


__all__ = [
    "AS_GIVEN",
    "EXACT",
    "POLICIES",
    "TokenCounter",
    "apply",
    "exact_skip",
    "has_padding",
    "normalise",
    "trim_padding",
]

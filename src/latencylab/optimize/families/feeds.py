"""A runner's inputs from a feed: the model's inputs by name, contiguous, or one error naming what is missing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from latencylab.errors import LatencyLabError


def pick(feed: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """``feed``'s arrays for ``names`` (C-contiguous, as the compiled runtimes want them)."""
    try:
        return {n: np.ascontiguousarray(feed[n]) for n in names}
    except KeyError as exc:
        raise LatencyLabError(f"feed has no input {exc.args[0]!r}; the model wants {list(names)}") from exc

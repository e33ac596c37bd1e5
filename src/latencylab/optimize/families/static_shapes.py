"""Static shapes, one home for every compiler family (OpenVINO, TVM): one compiled model per distinct input shape.

A compiler that knows every loop bound emits better code (TensorRT's optimisation profiles, TVM's static shapes,
OpenVINO's reshape). The families compile a model per distinct input shape they meet, up to
:data:`MAX_STATIC_SHAPES` (a few shapes that cover the real lengths); :func:`too_many` is the skip reason when
the held-out inputs have more, and :class:`PerShape` holds the compiled models, keyed by :func:`shape_key`.

Inputs of many lengths reach a few shapes by **length buckets** (:func:`pad_to_bucket`): right padding, the
attention mask 0 on it, to the smallest bucket edge that holds the input (edges chosen on the calibration
feeds' lengths by :func:`latencylab.optimize.buckets.choose_buckets`, never on held-out ones); an input longer
than every edge is padded to the next multiple of :data:`OVERFLOW_MULTIPLE`. Padding changes the work (the
runner's token counter credits the padded positions) and, on a model that honours its mask, not the output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from latencylab.optimize import shapes

MAX_STATIC_SHAPES = 8
OVERFLOW_MULTIPLE = 64

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]
T = TypeVar("T")


def shape_key(inputs: Mapping[str, np.ndarray]) -> ShapeKey:
    """The inputs' shapes, by name in a fixed order: what one static compile is for."""
    return tuple((n, tuple(int(d) for d in a.shape)) for n, a in sorted(inputs.items()))


def distinct(feeds: Iterable[Mapping[str, np.ndarray]], prepare: Callable[[Mapping[str, np.ndarray]], Any]) -> int:
    """How many distinct input shapes ``feeds`` have once ``prepare`` (the shape policy, buckets) has run."""
    return len({shape_key(prepare(f)) for f in feeds})


def too_many(n: int, what: str = "model") -> str | None:
    """The skip reason of a static candidate whose held-out inputs have ``n`` distinct shapes, or None."""
    if n <= MAX_STATIC_SHAPES:
        return None
    return (
        f"{n} distinct input shapes: static shapes compile one {what} per shape, at most {MAX_STATIC_SHAPES} "
        "(give fixed-length inputs, e.g. --param padding=max_length, or length buckets)"
    )


def lengths(feeds: Iterable[Mapping[str, np.ndarray]]) -> list[int]:
    """Each feed's real length: the last position its attention mask attends to (its width without a mask)."""
    out = []
    for f in feeds:
        mask = f.get(shapes.MASK)
        if mask is None or mask.ndim != 2:
            continue
        cols = np.flatnonzero(mask.any(axis=0))
        out.append(int(cols[-1]) + 1 if cols.size else 1)
    return out


def pad_to_bucket(feed: Mapping[str, np.ndarray], edges: Sequence[int]) -> dict[str, np.ndarray]:
    """``feed`` trimmed to its real length, then right-padded (zeros; mask 0) to its bucket (module docstring)."""
    trimmed = shapes.trim_padding(feed)
    mask = trimmed.get(shapes.MASK)
    if mask is None or mask.ndim != 2 or not edges:
        return dict(trimmed)
    n = int(mask.shape[1])
    width = next((int(e) for e in edges if n <= e), -(-n // OVERFLOW_MULTIPLE) * OVERFLOW_MULTIPLE)
    if width == n:
        return dict(trimmed)
    pad = width - n
    return {
        k: (np.pad(a, ((0, 0), (0, pad))) if a.ndim == 2 and a.shape == mask.shape else a) for k, a in trimmed.items()
    }


class PerShape(Generic[T]):
    """Compiled models by input shape, built by ``make(shape)`` on first sight, at most ``limit`` of them;
    ``get`` returns None past the limit (the caller falls back or refuses)."""

    def __init__(self, make: Callable[[ShapeKey], T], limit: int = MAX_STATIC_SHAPES) -> None:
        self.make = make
        self.limit = limit
        self.built: dict[ShapeKey, T] = {}

    def get(self, inputs: Mapping[str, np.ndarray]) -> T | None:
        key = shape_key(inputs)
        got = self.built.get(key)
        if got is None:
            if len(self.built) >= self.limit:
                return None
            got = self.built[key] = self.make(key)
        return got

    def __len__(self) -> int:
        return len(self.built)

    def clear(self) -> None:
        self.built.clear()

"""Mergeable HDR latency histogram (wraps the ``hdrhistogram`` package).

A :class:`LatencyHistogram` counts latencies (integer nanoseconds) in
HdrHistogram buckets: memory is fixed (about 200 KB at the defaults) however
many values are recorded, histograms from several load-generator workers or
time windows merge losslessly, and the standard compressed base64 encoding
moves them between processes and to other HDR implementations (Java, C, Go,
wrk2, HdrHistogram.js).

Resolution. HDR keeps ``significant_figures`` (s) decimal digits: a value v is
stored in a bucket no wider than ``v * 10**-s``, but never narrower than the
histogram's unit, ``2**floor(log2(lowest_ns))`` (512 ns at the default
``lowest_ns=1000``). So any value read back (quantile, min, max, CDF point) is
within ``max(v * 10**-s, unit)`` of a recorded value: relative error
<= 10**-s for v >= ``unit * 10**s`` (about 0.5 ms at the defaults), absolute
error <= unit below that. Pass ``lowest_ns=1`` for full relative precision
down to nanoseconds (the counts array grows by about 40%).

Bookkeeping is done here with numpy over hdrh's counts array (hdrh's own
per-value loops are pure Python); hdrh stores the counts and provides the wire
encoding and merge. Quirks of hdrh 0.10 handled here: ``add()`` sets the
minimum to 0 when the other histogram is empty; percentiles, min, max and mean
of an empty histogram come back as 0 (here: NaN); ``encode()`` returns bytes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from hdrh.histogram import HdrHistogram

from latencylab.errors import LatencyLabError

IntArray = npt.NDArray[np.int64]

_DICT_KEYS = ("lowest_ns", "highest_ns", "significant_figures", "count", "clamped", "encoded")


def _check_fraction(q: float) -> None:
    if not 0.0 <= q <= 1.0:  # also rejects NaN
        raise ValueError(f"quantile {q!r} is not a fraction in [0, 1] (0.99, not 99)")


@lru_cache(maxsize=16)
def _bucket_tables(
    unit_magnitude: int, sub_bucket_half_count_magnitude: int, bucket_count: int, counts_len: int
) -> tuple[IntArray, IntArray, IntArray]:
    """Per-layout lookup tables: bucket thresholds, and each index's lowest value and width.

    Bucket b holds values below ``sub_bucket_count << (unit_magnitude + b)``;
    the tables reproduce hdrh's ``get_value_from_index`` and
    ``get_highest_equivalent_value`` for every counts index at once.
    """
    sub_bucket_count = 1 << (sub_bucket_half_count_magnitude + 1)
    half = sub_bucket_count // 2
    thresholds = np.array([sub_bucket_count << (unit_magnitude + b) for b in range(bucket_count)], dtype=np.int64)
    idx = np.arange(counts_len, dtype=np.int64)
    bucket = (idx >> sub_bucket_half_count_magnitude) - 1
    sub = (idx & (half - 1)) + half
    first = bucket < 0
    sub[first] -= half
    bucket[first] = 0
    lowest = sub << (bucket + unit_magnitude)
    width = np.left_shift(np.int64(1), bucket + unit_magnitude)
    for arr in (thresholds, lowest, width):
        arr.setflags(write=False)
    return thresholds, lowest, width


class LatencyHistogram:
    """HDR histogram of latencies in nanoseconds; see the module docstring for resolution.

    Values below ``lowest_ns`` are recorded as ``lowest_ns``; values above
    ``highest_ns`` are recorded as ``highest_ns`` and counted in ``clamped``,
    so nothing recorded is ever lost. Negative and NaN values raise
    ``ValueError`` (a latency cannot be negative: that is a clock bug).
    """

    __slots__ = ("_counts", "_h", "clamped", "highest_ns", "lowest_ns", "significant_figures")

    def __init__(
        self,
        lowest_ns: int = 1_000,
        highest_ns: int = 3_600_000_000_000,
        significant_figures: int = 3,
    ) -> None:
        if isinstance(lowest_ns, bool) or not isinstance(lowest_ns, int) or lowest_ns < 1:
            raise LatencyLabError(f"histogram lowest_ns must be an integer >= 1, got {lowest_ns!r}")
        if isinstance(highest_ns, bool) or not isinstance(highest_ns, int) or highest_ns < 2 * lowest_ns:
            raise LatencyLabError(
                f"histogram highest_ns must be an integer >= 2 * lowest_ns ({2 * lowest_ns}), got {highest_ns!r}"
            )
        if highest_ns >= 2**62:
            raise LatencyLabError(f"histogram highest_ns must be below 2**62, got {highest_ns}")
        if significant_figures not in (1, 2, 3, 4, 5):
            raise LatencyLabError(f"histogram significant_figures must be 1-5, got {significant_figures!r}")
        self.lowest_ns = lowest_ns
        self.highest_ns = highest_ns
        self.significant_figures = significant_figures
        self.clamped = 0
        self._h = HdrHistogram(lowest_ns, highest_ns, significant_figures)
        self._counts = self._view(self._h)

    @staticmethod
    def _view(h: HdrHistogram) -> npt.NDArray[np.uint64]:
        # A numpy view sharing memory with hdrh's ctypes counts (64-bit counters).
        return np.ctypeslib.as_array(h.counts)

    def _tables(self) -> tuple[IntArray, IntArray, IntArray]:
        h = self._h
        return _bucket_tables(h.unit_magnitude, h.sub_bucket_half_count_magnitude, h.bucket_count, h.counts_len)

    @property
    def layout(self) -> tuple[int, int, int]:
        """``(lowest_ns, highest_ns, significant_figures)``: histograms merge only within one layout."""
        return (self.lowest_ns, self.highest_ns, self.significant_figures)

    def __repr__(self) -> str:
        return (
            f"LatencyHistogram(count={self.count}, lowest_ns={self.lowest_ns}, "
            f"highest_ns={self.highest_ns}, significant_figures={self.significant_figures})"
        )

    # -- recording -------------------------------------------------------------------------

    def record(self, ns: int | float, count: int = 1) -> None:
        """Record ``count`` occurrences of latency ``ns``."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if count == 0:
            return
        if math.isnan(ns) or ns < 0:
            raise ValueError(f"latency {ns!r} ns is not a non-negative number")
        if math.isinf(ns) or round(ns) > self.highest_ns:
            self.clamped += count
            v = self.highest_ns
        else:
            v = max(int(round(ns)), self.lowest_ns)  # noqa: RUF046 (numpy ints round to numpy ints)
        self._h.record_value(v, count)

    def record_many(self, values_ns: Iterable[int | float]) -> None:
        """Record every value in ``values_ns`` (vectorised; same result as ``record`` in a loop)."""
        if isinstance(values_ns, np.ndarray):
            raw = values_ns.astype(np.float64, copy=False).ravel()
        else:
            raw = np.fromiter(values_ns, dtype=np.float64)
        if raw.size == 0:
            return
        if np.isnan(raw).any() or (raw < 0).any():
            bad = raw[np.isnan(raw) | (raw < 0)][0]
            raise ValueError(f"latency {bad!r} ns is not a non-negative number")
        rounded = np.rint(raw)
        over = rounded > self.highest_ns
        self.clamped += int(over.sum())
        v = np.clip(rounded, self.lowest_ns, self.highest_ns).astype(np.int64)
        h = self._h
        thresholds, _, _ = self._tables()
        bucket = np.searchsorted(thresholds, v, side="right").astype(np.int64)
        sub = v >> (bucket + h.unit_magnitude)
        idx = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
        self._counts += np.bincount(idx, minlength=h.counts_len).astype(np.uint64)
        h.total_count += int(v.size)
        h.min_value = min(h.min_value, int(v.min()))
        h.max_value = max(h.max_value, int(v.max()))

    # -- merging ---------------------------------------------------------------------------

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts into this histogram (lossless; layouts must match)."""
        if other.layout != self.layout:
            raise LatencyLabError(
                "cannot merge histograms with different layouts "
                f"(lowest_ns, highest_ns, significant_figures): {self.layout} vs {other.layout}"
            )
        if other.count == 0:
            # hdrh's add() would set our minimum to 0 here.
            self.clamped += other.clamped
            return
        mine = self._h
        theirs = other._h
        min_before, max_before = mine.min_value, mine.max_value
        mine.add(theirs)
        mine.min_value = min(min_before, theirs.min_value)
        mine.max_value = max(max_before, theirs.max_value)
        self.clamped += other.clamped

    @classmethod
    def merged(cls, hists: Iterable[LatencyHistogram]) -> LatencyHistogram:
        """A new histogram holding the sum of ``hists`` (which must share one layout)."""
        out: LatencyHistogram | None = None
        for h in hists:
            if out is None:
                out = h.copy()
            else:
                out.merge(h)
        if out is None:
            raise ValueError("merged() needs at least one histogram")
        return out

    # -- statistics ------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Number of values recorded (clamped ones included)."""
        return int(self._h.total_count)

    def _nonzero(self) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self._counts)

    @property
    def min_ns(self) -> float:
        """Lowest value of the lowest occupied bucket (NaN when empty)."""
        nz = self._nonzero()
        if nz.size == 0:
            return math.nan
        return float(self._tables()[1][nz[0]])

    @property
    def max_ns(self) -> float:
        """Highest value of the highest occupied bucket (NaN when empty)."""
        nz = self._nonzero()
        if nz.size == 0:
            return math.nan
        _, lowest, width = self._tables()
        i = nz[-1]
        return float(lowest[i] + width[i] - 1)

    def _mid_and_counts(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        nz = self._nonzero()
        _, lowest, width = self._tables()
        # hdrh's mean/std use each bucket's median equivalent value.
        mid = (lowest[nz] + (width[nz] >> 1)).astype(np.float64)
        return mid, self._counts[nz].astype(np.float64)

    @property
    def mean_ns(self) -> float:
        """Mean, each value taken at its bucket's midpoint (NaN when empty)."""
        if self.count == 0:
            return math.nan
        mid, cnt = self._mid_and_counts()
        return float(np.dot(mid, cnt) / cnt.sum())

    @property
    def std_ns(self) -> float:
        """Population standard deviation over bucket midpoints, as hdrh computes it (NaN when empty)."""
        if self.count == 0:
            return math.nan
        mid, cnt = self._mid_and_counts()
        mean = np.dot(mid, cnt) / cnt.sum()
        return float(math.sqrt(np.dot((mid - mean) ** 2, cnt) / cnt.sum()))

    def quantile(self, q: float) -> float:
        """Latency (ns) at quantile ``q``, a fraction in [0, 1].

        HDR's value-at-percentile: with n values recorded, the value of rank
        ``k = max(1, round(q * n))`` (1-based), reported as the highest value
        of its bucket (the lowest value for q = 0). The result is therefore
        never below that recorded value and exceeds it by less than
        ``max(value * 10**-significant_figures, unit)``: relative error
        <= 10**-significant_figures above ``unit * 10**significant_figures``
        (unit = 2**floor(log2(lowest_ns)); see the module docstring).
        NaN when the histogram is empty (hdrh would say 0).
        """
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """``quantile`` at each fraction in ``qs`` (one pass over the counts)."""
        for q in qs:
            _check_fraction(q)
        total = self.count
        if total == 0:
            return [math.nan] * len(qs)
        _, lowest, width = self._tables()
        cum = np.cumsum(self._counts)
        out: list[float] = []
        for q in qs:
            pct = q * 100.0
            # hdrh's get_target_count_at_percentile, float expression kept identical.
            target = max(int((min(pct, 100.0) * total / 100) + 0.5), 1)
            i = int(np.searchsorted(cum, target, side="left"))
            value = lowest[i] + width[i] - 1 if pct else lowest[i]
            out.append(float(value))
        return out

    def cdf(self) -> list[tuple[float, float]]:
        """``(value_ns, fraction of values <= value_ns)`` at the top of each occupied bucket.

        The fraction is exact at each point (every value in a bucket is <= its
        top), so the points plot the empirical CDF at the histogram's resolution.
        """
        nz = self._nonzero()
        if nz.size == 0:
            return []
        _, lowest, width = self._tables()
        tops = (lowest[nz] + width[nz] - 1).tolist()
        cum = np.cumsum(self._counts[nz]).astype(np.float64) / float(self.count)
        return list(zip((float(t) for t in tops), cum.tolist(), strict=True))

    # -- serialisation ---------------------------------------------------------------------

    def encode(self) -> str:
        """Standard compressed base64 HDR encoding (V2, "HISTF..."), readable by other HDR libraries.

        ``clamped`` is not part of the HDR format; ``to_dict`` carries it.
        """
        return bytes(self._h.encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> LatencyHistogram:
        """Histogram from ``encode()``'s text (or any HDR V2 base64 histogram)."""
        try:
            decoded = HdrHistogram.decode(text.strip() if isinstance(text, str) else text)
            lowest = int(decoded.lowest_trackable_value)
            highest = int(decoded.highest_trackable_value)
            sig = int(decoded.significant_figures)
            counts = np.array(cls._view(decoded), dtype=np.uint64)
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise LatencyLabError(f"not an encoded HDR histogram: {reason}") from None
        out = cls(lowest, highest, sig)
        if counts.size != out._counts.size:
            raise LatencyLabError(
                f"not an encoded HDR histogram: {counts.size} counters for a layout of {out._counts.size}"
            )
        out._counts[:] = counts
        out._sync_from_counts()
        return out

    def _sync_from_counts(self) -> None:
        """Set hdrh's total/min/max from the counts array (after a bulk copy)."""
        h = self._h
        h.total_count = int(self._counts.sum())
        nz = self._nonzero()
        if nz.size == 0:
            h.min_value, h.max_value = sys.maxsize, 0
            return
        _, lowest, width = self._tables()
        h.min_value = int(lowest[nz[0]])
        h.max_value = int(lowest[nz[-1]] + width[nz[-1]] - 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: layout, count, clamped and the HDR encoding."""
        return {
            "lowest_ns": self.lowest_ns,
            "highest_ns": self.highest_ns,
            "significant_figures": self.significant_figures,
            "count": self.count,
            "clamped": self.clamped,
            "encoded": self.encode(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyHistogram:
        """Inverse of ``to_dict``; checks that the encoding agrees with the stated layout and count."""
        missing = [k for k in _DICT_KEYS if k not in d]
        if missing:
            raise LatencyLabError(f"histogram dict lacks {', '.join(missing)}")
        out = cls.decode(str(d["encoded"]))
        stated = (d["lowest_ns"], d["highest_ns"], d["significant_figures"])
        if out.layout != stated:
            raise LatencyLabError(f"histogram dict states layout {stated} but its encoding has {out.layout}")
        if out.count != d["count"]:
            raise LatencyLabError(f"histogram dict states count {d['count']} but its encoding holds {out.count}")
        out.clamped = int(d["clamped"])
        return out

    # -- housekeeping ----------------------------------------------------------------------

    def copy(self) -> LatencyHistogram:
        """An independent histogram with the same layout, counts and ``clamped``."""
        out = LatencyHistogram(self.lowest_ns, self.highest_ns, self.significant_figures)
        out._counts[:] = self._counts
        out._h.total_count = self._h.total_count
        out._h.min_value = self._h.min_value
        out._h.max_value = self._h.max_value
        out.clamped = self.clamped
        return out

    def reset(self) -> None:
        """Forget every recorded value (the layout stays)."""
        self._counts[:] = 0
        self._h.total_count = 0
        self._h.min_value = sys.maxsize
        self._h.max_value = 0
        self.clamped = 0

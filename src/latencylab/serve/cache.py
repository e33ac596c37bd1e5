"""Result cache: answers keyed by the full content of a request, LRU-bounded, with a stale tier.

The guard's last rung answers from here. An entry is *fresh* for ``ttl_s``
after it was stored and *stale* until ``stale_s``; ``get(allow_stale=True)``
(the cache rung, where a stale answer beats none) returns stale entries
labelled as such, ``get()`` only fresh ones. Entries older than ``stale_s``
are dropped when touched; ``max_entries`` bounds memory (least recently used
first out).

Keys are the request's full canonical content, used directly as the dict key,
so two requests share an entry only when they are byte-for-byte the same
request (no hash-only collisions: a hash is only the dict's bucket).
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.serve.types import DATATYPES, InferRequest, Tensor

_KEY_MAGIC = b"LLRC1\0"  # format tag: a change of layout must never collide with the old one


def _lp(b: bytes) -> bytes:
    """Length-prefixed bytes (8-byte little-endian length): makes concatenation unambiguous."""
    return struct.pack("<Q", len(b)) + b


def _element_bytes(x: object) -> bytes:
    if isinstance(x, bytes | bytearray | memoryview):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")
    raise TypeError(f"BYTES tensor element of type {type(x).__name__} (bytes expected)")


def _tensor_key(t: Tensor) -> bytes:
    data = np.asarray(t.data)
    parts = [_lp(t.name.encode()), _lp(t.datatype.encode()), struct.pack(f"<Q{len(t.shape)}q", len(t.shape), *t.shape)]
    if t.datatype == "BYTES":
        elements = data.ravel()
        parts.append(struct.pack("<Q", elements.size))
        parts.extend(_lp(_element_bytes(x)) for x in elements)
    else:
        if data.dtype.hasobject:  # an object array's bytes would be pointers
            data = data.astype(DATATYPES.get(t.datatype, np.float64))
        # The array's own dtype (with byte order) and its C-order bytes: no conversion, so no two
        # different arrays can meet in one key.
        parts.append(_lp(data.dtype.str.encode()))
        parts.append(_lp(data.tobytes()))
    return b"".join(parts)


def _frozen(t: Tensor) -> Tensor:
    """A copy of ``t`` whose array is private and read-only (cached answers are shared by many responses)."""
    data = np.array(t.data, copy=True)
    data.flags.writeable = False
    return Tensor(t.name, t.datatype, t.shape, data)


@dataclass(frozen=True, slots=True)
class CacheHit:
    outputs: tuple[Tensor, ...]  # read-only arrays, shared between hits
    variant: str  # the ladder level that produced the answer
    age_s: float  # since the answer was stored
    stale: bool  # older than ttl_s (only with ``get(allow_stale=True)``)


class ResultCache:
    """Thread-safe LRU cache of inference results with a fresh (``ttl_s``) and a stale (``stale_s``) tier.

    Counters: ``hits`` (fresh), ``stale_hits``, ``misses`` (every ``get`` is
    exactly one of the three), ``evictions`` (LRU, for room) and ``expired``
    (found older than ``stale_s`` and dropped).
    """

    def __init__(
        self, max_entries: int = 10_000, ttl_s: float = 60.0, stale_s: float = 600.0, clock: Clock | None = None
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise LatencyLabError(f"cache max_entries must be an integer >= 1, got {max_entries!r}")
        if not ttl_s > 0:
            raise LatencyLabError(f"cache ttl_s must be > 0, got {ttl_s!r}")
        if not stale_s >= ttl_s:
            raise LatencyLabError(f"cache stale_s ({stale_s!r}) must be >= ttl_s ({ttl_s!r})")
        self.max_entries = max_entries
        self.ttl_s = float(ttl_s)
        self.stale_s = float(stale_s)
        self._ttl_ns = round(ttl_s * 1e9)
        self._stale_ns = round(stale_s * 1e9)
        self._clock: Clock = clock if clock is not None else PerfCounterClock()
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[tuple[Tensor, ...], str, int]] = OrderedDict()
        self.hits = 0
        self.stale_hits = 0
        self.misses = 0
        self.evictions = 0
        self.expired = 0

    @staticmethod
    def key(model: str, request: InferRequest) -> bytes:
        """The canonical key of ``request`` to ``model``: its full content as bytes.

        Layout (every variable-length field length-prefixed): model, requested
        version, requested output names (sorted; absent = all), then each
        input sorted by name: name, datatype, shape, and the data (numeric:
        numpy dtype and ``tobytes()``; BYTES: each element). Request
        ``parameters`` and ``id`` are not part of the key: they do not change
        the answer.
        """
        parts = [_KEY_MAGIC, _lp(model.encode()), _lp((request.version or "").encode())]
        if request.outputs is None:
            parts.append(b"\0")
        else:
            names = sorted(request.outputs)
            parts.append(b"\1" + struct.pack("<Q", len(names)))
            parts.extend(_lp(n.encode()) for n in names)
        inputs = sorted(request.inputs, key=lambda t: t.name)
        parts.append(struct.pack("<Q", len(inputs)))
        parts.extend(_tensor_key(t) for t in inputs)
        return b"".join(parts)

    def _now_ns(self) -> int:
        return int(self._clock.resolve([self._clock.mark()])[0])

    def get(self, key: bytes, allow_stale: bool = False) -> CacheHit | None:
        """The answer stored under ``key``: fresh ones always, stale ones only when ``allow_stale``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            outputs, variant, stored_ns = entry
            age_ns = self._now_ns() - stored_ns
            if age_ns > self._stale_ns:
                del self._entries[key]
                self.expired += 1
                self.misses += 1
                return None
            stale = age_ns > self._ttl_ns
            if stale and not allow_stale:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            if stale:
                self.stale_hits += 1
            else:
                self.hits += 1
            return CacheHit(outputs, variant, age_ns / 1e9, stale)

    def put(self, key: bytes, outputs: tuple[Tensor, ...], variant: str) -> None:
        """Store (or replace) the answer under ``key``; evicts the least recently used beyond ``max_entries``.

        The arrays are copied (and made read-only), so later changes to the
        caller's buffers cannot alter a cached answer.
        """
        frozen = tuple(_frozen(t) for t in outputs)
        with self._lock:
            self._entries[key] = (frozen, variant, self._now_ns())
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "hits": self.hits,
                "stale_hits": self.stale_hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "expired": self.expired,
            }

"""The generative server's fallback ladder: which engine serves each rung, and the exact-prompt answer cache.

A ladder is a list of rung names, best first, e.g. ``fp32 -> int8 -> capped -> cache``:

* a **model rung** (any other name: ``fp32``, ``int8``) is served by the engine of that name, each with its own
  continuous-batching scheduler (its own batch and KV cache);
* ``capped`` is the lighter setting: the engine of the nearest model rung above it, with every request's
  ``max_tokens`` cut to ``cap_tokens`` (the answer says so: ``latencylab.max_tokens_cap``, the
  ``X-LatencyLab-Max-Tokens-Cap`` header, and ``finish_reason: length`` when the cap ended it);
* ``cache`` (last only) answers a repeated request from the :class:`AnswerCache`; a miss is served by the rung
  above it, and is no evidence about the cache rung.

The answer cache holds finished answers of deterministic requests (greedy, or sampled with a seed), keyed by the
request's full content: prompt token ids, ``max_tokens`` as asked, sampling, stop strings. It reuses the OIP
server's LRU + TTL :class:`~latencylab.serve.cache.ResultCache` (fresh, then stale: the cache rung takes a stale
answer over none).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError
from latencylab.serve.cache import ResultCache
from latencylab.serve.types import Tensor

__all__ = ["CACHE", "CAPPED", "AnswerCache", "CachedAnswer", "Rung", "plan_ladder"]

CAPPED = "capped"
CACHE = "cache"


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung: its name, the engine that serves it, the ``max_tokens`` cap it applies, whether it is the cache."""

    name: str
    engine: str
    cap: int | None = None
    cache: bool = False


def plan_ladder(names: Sequence[str], engines: Sequence[str], cap_tokens: int) -> tuple[Rung, ...]:
    """The rungs of ``names`` (best first) over the engines available; a one-line error for a ladder that
    cannot be served."""
    names = tuple(names)
    if not names:
        raise LatencyLabError("the ladder needs at least one rung")
    if len(set(names)) != len(names):
        raise LatencyLabError(f"ladder rungs must be distinct, got {','.join(names)}")
    if names[0] in (CAPPED, CACHE):
        raise LatencyLabError(f"the ladder must start with a model rung ({', '.join(engines)}), got {names[0]!r}")
    if cap_tokens < 1:
        raise LatencyLabError(f"the capped rung's max_tokens cap must be >= 1, got {cap_tokens}")
    rungs: list[Rung] = []
    engine = names[0]
    for i, name in enumerate(names):
        if name == CACHE:
            if i != len(names) - 1:
                raise LatencyLabError("'cache' must be the ladder's last rung")
            rungs.append(Rung(name, rungs[-1].engine, rungs[-1].cap, cache=True))
        elif name == CAPPED:
            rungs.append(Rung(name, engine, cap_tokens))
        elif name in engines:
            engine = name
            rungs.append(Rung(name, engine))
        else:
            known = ", ".join([*engines, CAPPED, CACHE])
            raise LatencyLabError(f"unknown ladder rung {name!r}; known: {known}")
    return tuple(rungs)


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    ids: tuple[int, ...]  # the output tokens (EOS excluded)
    text: str  # as sent (cut before a stop string)
    finish: str  # "stop" | "length"
    producer: str  # the rung that generated it
    cap: int | None  # the cap it was generated under
    age_s: float = 0.0
    stale: bool = False


class AnswerCache:
    """Finished answers of deterministic requests (see the module docstring)."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Clock | None = None) -> None:
        self.store = ResultCache(max_entries, ttl_s, max(ttl_s, 10 * ttl_s), clock)

    @staticmethod
    def key(
        prompt_ids: Sequence[int], max_tokens: int, temperature: float, top_p: float, seed: int | None,
        stop: Sequence[str],
    ) -> bytes | None:  # fmt: skip
        """The request's full content as bytes; None when its answer is not deterministic (sampled, no seed)."""
        if temperature > 0 and seed is None:
            return None
        head = struct.pack("<6sqddq", b"LLGC1\0", max_tokens, temperature, top_p, -1 if seed is None else seed)
        ids = struct.pack(f"<Q{len(prompt_ids)}q", len(prompt_ids), *prompt_ids)
        stops = json.dumps(list(stop)).encode()
        return head + ids + struct.pack("<Q", len(stops)) + stops

    def get(self, key: bytes) -> CachedAnswer | None:
        hit = self.store.get(key, allow_stale=True)
        if hit is None:
            return None
        doc = json.loads(bytes(hit.outputs[0].data.ravel()[0]))
        return CachedAnswer(tuple(doc["ids"]), doc["text"], doc["finish"], hit.variant, doc["cap"], hit.age_s,
                            hit.stale)  # fmt: skip

    def put(self, key: bytes, ids: Sequence[int], text: str, finish: str, producer: str, cap: int | None) -> None:
        doc = json.dumps({"ids": list(ids), "text": text, "finish": finish, "cap": cap}).encode()
        data = np.array([doc], dtype=object)
        self.store.put(key, (Tensor("answer", "BYTES", (1,), data),), producer)

"""A fake model for the scheduler and the HTTP layer: known step costs on a clock, deterministic tokens.

:class:`FakeEngine` charges ``prefill_overhead_ns + prefill_ns_per_token x tokens`` per prefill chunk and
``decode_base_ns + decode_ns_per_seq x batch`` per decode step, by advancing a
:class:`~latencylab.clock.FakeClock` (tests: exact times) or by sleeping (a server test on the real clock).
Token ``k`` (0-based) of a sequence is ``first_token + k``; a sequence ends with ``eos`` after
``reply_len(seq)`` tokens (by default its prompt's first id, so a test sets each reply's length).
:class:`FakeTokenizer` maps characters to ids and back (one character, one token).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from latencylab.clock import FakeClock
from latencylab.genserve.scheduler import Seq

EOS = 2
FIRST_TOKEN = 1000


class FakeEngine:
    def __init__(
        self,
        clock: FakeClock | None = None,
        *,
        prefill_ns_per_token: int = 1_000_000,
        prefill_overhead_ns: int = 0,
        decode_base_ns: int = 20_000_000,
        decode_ns_per_seq: int = 2_000_000,
        reply_len: Callable[[Seq], int] | None = None,
        eos: int = EOS,
        prefix: tuple[int, ...] = (),
    ) -> None:
        self.clock = clock
        self.prefill_ns_per_token = prefill_ns_per_token
        self.prefill_overhead_ns = prefill_overhead_ns
        self.decode_base_ns = decode_base_ns
        self.decode_ns_per_seq = decode_ns_per_seq
        self.reply_len = reply_len or (lambda s: s.req.prompt_ids[0])
        self.eos = eos
        self.calls: list[tuple[Any, ...]] = []  # ("prefill", id, start, end) | ("decode", (ids...)) | ("release", id)
        self.cached: dict[int, int] = {}  # seq id -> positions in its (fake) cache
        self.prefix = prefix  # a prefix cache's tokens (genserve/prefix.py): a prompt starting with them skips them

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        from latencylab.genserve.prefix import common_prefix

        n = min(common_prefix(self.prefix, prompt_ids), len(prompt_ids) - 1)
        return n if self.prefix and n == len(self.prefix) else 0

    def _spend(self, ns: int) -> None:
        if self.clock is not None:
            self.clock.advance(ns)
        else:
            time.sleep(ns / 1e9)

    def _next(self, s: Seq) -> int:
        k = len(s.tokens)
        return self.eos if k + 1 >= self.reply_len(s) else FIRST_TOKEN + k

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        have = self.cached.get(seq.id, self.cached_prefix(seq.req.prompt_ids))
        if have != start:
            raise AssertionError(f"seq {seq.id}: prefill from {start}, cache holds {have}")
        self.calls.append(("prefill", seq.id, start, end))
        self._spend(self.prefill_overhead_ns + self.prefill_ns_per_token * (end - start))
        self.cached[seq.id] = end
        return self._next(seq) if end == seq.prompt_len else None

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        self.calls.append(("decode", tuple(s.id for s in seqs)))
        self._spend(self.decode_base_ns + self.decode_ns_per_seq * len(seqs))
        for s in seqs:
            self.cached[s.id] += 1
        return [self._next(s) for s in seqs]

    def release(self, seq: Seq) -> None:
        self.calls.append(("release", seq.id))
        self.cached.pop(seq.id, None)

    def decodes(self) -> list[tuple[int, ...]]:
        return [c[1] for c in self.calls if c[0] == "decode"]


class FusedFakeEngine(FakeEngine):
    """The fake engine as a fused one (genserve/packed.py's ``mixed``): a step's chunks and decode batch in one
    forward, charged ``decode_base_ns + decode_ns_per_seq x batch + prefill_ns_per_token x tokens`` with a decode
    batch and ``prefill_overhead_ns + prefill_ns_per_token x tokens`` without (the fixed cost once a forward)."""

    fused = True

    def mixed(self, chunks: Sequence[tuple[Seq, int, int]], seqs: Sequence[Seq]) -> tuple[list[int | None], list[int]]:
        tokens = sum(end - start for _, start, end in chunks)
        self.calls.append(("mixed", tuple((s.id, a, b) for s, a, b in chunks), tuple(s.id for s in seqs)))
        fixed = self.decode_base_ns + self.decode_ns_per_seq * len(seqs) if seqs else self.prefill_overhead_ns
        self._spend(fixed + self.prefill_ns_per_token * tokens)
        firsts: list[int | None] = []
        for seq, start, end in chunks:
            have = self.cached.get(seq.id, self.cached_prefix(seq.req.prompt_ids))
            if have != start:
                raise AssertionError(f"seq {seq.id}: prefill from {start}, cache holds {have}")
            self.cached[seq.id] = end
            firsts.append(self._next(seq) if end == seq.prompt_len else None)
        for s in seqs:
            self.cached[s.id] += 1
        return firsts, [self._next(s) for s in seqs]

    def prefill(self, seq: Seq, start: int, end: int) -> int | None:
        return self.mixed([(seq, start, end)], [])[0][0]

    def decode(self, seqs: Sequence[Seq]) -> list[int]:
        return self.mixed([], seqs)[1]

    def chunks_of(self, seq_id: int) -> list[tuple[int, int]]:
        return [(a, b) for c in self.calls if c[0] == "mixed" for i, a, b in c[1] if i == seq_id]


class FakeTokenizer:
    """One token per character (ids = code points + 10, clear of EOS; the engine's output ids from
    ``FIRST_TOKEN`` read as "abc..."): the ``Codec`` of genserve.service."""

    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 10 for c in text]

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.encode("\n".join(m["content"] for m in messages))

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(ord("a") + (i - FIRST_TOKEN) % 26) if i >= FIRST_TOKEN else chr(i - 10) for i in ids
                       if i != EOS)  # fmt: skip

"""Greedy speculative decoding with a model draft, both as ONNX Runtime graphs (``gen/ort_decode.OrtLM``): the
draft (e.g. the target's graph with blockwise INT8 MatMuls) proposes ``k`` tokens one plain step at a time, the
target verifies them as one causal chunk (its every-position graph), keeps the longest agreeing prefix and its
own next token, and the target's cache is cut back to what was kept. The tokens are the target graph's plain greedy
tokens, by construction: the draft only decides how many a verify step yields.

Cache invariants: the target's holds every context token but the last; the draft's holds ``ctx[:dc.length]`` and
is fed ``ctx[dc.length:]`` before it drafts again. The draft has no cache of its own: it shares the target's
buffers (``KVCache.share``: the prompt's K/V from the FP32 prefill, then the target's cache cut to what was kept)
and writes its drafted positions after the target's length, where the verify then writes the target's own; so it
needs no prefill (TTFT is the target's), no cut and no copy. Its K/V differ from what it would compute itself,
which can only change how often it is right, never the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from latencylab.clock import Clock
from latencylab.gen.ort_decode import OrtDecodeRun, OrtLM, take

__all__ = ["generate_with_draft"]


def generate_with_draft(
    target: OrtLM, draft: OrtLM, ids: Sequence[int], n: int, eos: frozenset[int], clock: Clock, k: int = 4
) -> OrtDecodeRun:
    import numpy as np

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ctx, toks = list(ids), list[int]()
    marks = [clock.mark()]
    tc = target.empty_cache(len(ctx) + n + k + 1)
    logits = target.run(ctx, tc)
    # the draft drafts over the target's cache (the prompt's FP32 K/V): no prefill of its own; it writes its
    # drafted positions after the target's, which the verify overwrites with the target's own
    dc = tc.share()
    new = [int(np.argmax(logits[-1]))]
    proposed = accepted = steps = 0
    while not take(new, toks, ctx, eos, n):
        marks.append(clock.mark())
        kk = min(k, n - len(toks) - 1)
        if kk == 0:  # one token left: a plain step
            logits = target.run(ctx[-1:], tc)
            new = [int(np.argmax(logits[-1]))]
            steps += 1
            continue
        drafts: list[int] = []
        feed = ctx[dc.length :]
        for _ in range(kk):
            lg = draft.run(feed, dc)
            drafts.append(int(np.argmax(lg[-1])))
            feed = drafts[-1:]
        logits = target.run([ctx[-1], *drafts], tc, every=True)
        greedy = np.argmax(logits, axis=-1)
        a = 0
        while a < kk and drafts[a] == int(greedy[a]):
            a += 1
        steps, proposed, accepted = steps + 1, proposed + kk, accepted + a
        new = [*drafts[:a], int(greedy[a])]
        # kept: the context (its last token now in the target's cache) and the accepted drafts
        OrtLM.cut(tc, len(ctx) + a)
        dc = tc.share()
    marks.append(clock.mark())
    t = [int(x) for x in clock.resolve(marks)]
    return OrtDecodeRun(tuple(toks), t[1] - t[0], t[-1] - t[1], proposed, accepted, steps)

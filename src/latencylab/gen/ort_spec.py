"""Greedy speculative decoding with a model draft, both as ONNX Runtime graphs (``gen/ort_decode.OrtLM``): the
draft (e.g. the target's graph with blockwise INT8 MatMuls) proposes ``k`` tokens one plain step at a time, the
target verifies them as one causal chunk (its every-position graph), keeps the longest agreeing prefix and its
own next token, and the target's cache is cut back to what was kept. The tokens are the target graph's plain greedy
tokens, by construction: the draft only decides how many a verify step yields.

Cache invariants: the target's holds every context token but the last; the draft's holds ``ctx[:dlen]`` and is fed
``ctx[dlen:]`` before it drafts again. The draft has no cache of its own between steps: it starts from the target's
(the prompt's K/V from the FP32 prefill, then the target's cache cut to what was kept), so it needs no prefill of
its own (TTFT is the target's) and no cut of its own; its K/V differ from what it would compute itself, which can
only change how often it is right, never the tokens.
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
    tk, tv = target.empty_cache()
    logits, tk, tv = target.run(ctx, tk, tv)
    # the draft drafts over the target's cache (the prompt's FP32 K/V): no prefill of its own, and after each
    # verify it takes the target's cut cache again, so only its drafted positions are its own
    dk, dv, dlen = tk, tv, len(ctx)
    new = [int(np.argmax(logits[-1]))]
    proposed = accepted = steps = 0
    while not take(new, toks, ctx, eos, n):
        marks.append(clock.mark())
        kk = min(k, n - len(toks) - 1)
        if kk == 0:  # one token left: a plain step
            logits, tk, tv = target.run(ctx[-1:], tk, tv)
            new = [int(np.argmax(logits[-1]))]
            steps += 1
            continue
        drafts: list[int] = []
        feed = ctx[dlen:]
        for _ in range(kk):
            lg, dk, dv = draft.run(feed, dk, dv)
            dlen += len(feed)
            drafts.append(int(np.argmax(lg[-1])))
            feed = drafts[-1:]
        logits, tk, tv = target.run([ctx[-1], *drafts], tk, tv, every=True)
        greedy = np.argmax(logits, axis=-1)
        a = 0
        while a < kk and drafts[a] == int(greedy[a]):
            a += 1
        steps, proposed, accepted = steps + 1, proposed + kk, accepted + a
        new = [*drafts[:a], int(greedy[a])]
        # kept: the context (its last token now in the target's cache) and the accepted drafts
        tk, tv = OrtLM.cut(tk, tv, len(ctx) + a)
        dk, dv, dlen = tk, tv, len(ctx) + a
    marks.append(clock.mark())
    t = [int(x) for x in clock.resolve(marks)]
    return OrtDecodeRun(tuple(toks), t[1] - t[0], t[-1] - t[1], proposed, accepted, steps)

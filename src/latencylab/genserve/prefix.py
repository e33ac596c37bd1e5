"""The prefix cache: a fixed prompt prefix every chat request shares, prefilled once, its K/V reused.

SmolLM2's chat template opens every conversation with the same tokens (a default system prompt and the
template's markers: 24 tokens, ``<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...
<|im_start|>user\\n``). The server finds that prefix from the template itself (:func:`chat_prefix`: the tokens
two different one-message conversations share), prefills it once at start-up (:class:`PrefixKV`), and a
sequence whose prompt starts with it begins its prefill after it: its own cache is seeded with a copy of the
prefix's K/V (``DynamicCache.update`` appends by ``torch.cat``, so the stored tensors are never written), and
only the rest of its prompt is run through the model. A prompt that does not start with it (a raw completion,
a chat with its own system prompt) shares only the tokens it has in common, or none, and is prefilled as before.

Equal work for equal output: the K/V of a causal model's first ``n`` positions depend only on those ``n``
tokens, so a cached prefix gives the tokens a whole prefill gives (up to float summation order; the slow test in
tests/test_genserve_engine.py checks greedy outputs token for token). The gain is the prefix's prefill, per
request: ``n`` tokens of the prompt's prefill cost, not the forward's fixed cost (the rest of the prompt still
needs one).

The scheduler asks the engine :meth:`~PrefixKV.match` at admission and counts the hit as already prefilled
(``Seq.cached_tokens``): its step costs, its budget and admission's TTFT forecast see only the tokens left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PrefixKV", "chat_prefix", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def chat_prefix(encode_chat: Any) -> tuple[int, ...]:
    """The tokens every one-user-message conversation starts with under a chat template: the common prefix of
    two conversations that differ from their first character on (``encode_chat(messages) -> ids``)."""
    a = encode_chat([{"role": "user", "content": "A"}])
    b = encode_chat([{"role": "user", "content": "Zebra crossing"}])
    return tuple(a[: common_prefix(a, b)])


class PrefixKV:
    """One prompt prefix's K/V, per layer (batch 1), and how much of a prompt it covers.

    ``min_tokens``: a shorter match is not worth a copy (and is no template prefix). ``max_rest_tokens``: a prompt
    with more tokens than this after the prefix is prefilled whole, a precaution: in one run of
    benchmarks/gen_prefix_cache.py (session 13) a 380- or 529-token rest after a cached prefix took ~10% longer
    than the whole prompt, within this machine's noise (a second run varied 23% on the same work); rests up to
    ~200 tokens saved 20-70 ms in both runs."""

    def __init__(
        self, ids: Sequence[int], layers: Sequence[tuple[Any, Any]], min_tokens: int = 4, max_rest_tokens: int = 256
    ) -> None:
        self.ids = tuple(ids)
        self.layers = tuple(layers)  # (keys, values), each [1, heads, len(ids), head_dim]
        self.min_tokens = min_tokens
        self.max_rest_tokens = max_rest_tokens

    @classmethod
    def build(cls, model: Any, ids: Sequence[int], cache_kwarg: str, new_cache: Any) -> PrefixKV:
        """Prefill ``ids`` once through ``model`` and keep its K/V."""
        import torch

        cache = new_cache()
        x = torch.tensor([list(ids)], dtype=torch.long)
        with torch.inference_mode():
            model(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
        return cls(ids, [(layer.keys, layer.values) for layer in cache.layers])

    def match(self, prompt: Sequence[int]) -> int:
        """Prompt tokens whose K/V this prefix holds: the common prefix, at most ``len(prompt) - 1`` (the last
        prompt token must run through the model: its logits give the first output token); 0 under
        ``min_tokens`` or with more than ``max_rest_tokens`` left."""
        n = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        return n if n >= self.min_tokens and len(prompt) - n <= self.max_rest_tokens else 0

    def seed(self, cache: Any, n: int) -> None:
        """Append the prefix's first ``n`` positions to an empty ``cache`` (copied: the stored K/V stay as they are)."""
        for li, (k, v) in enumerate(self.layers):
            cache.update(k[:, :, :n, :], v[:, :, :n, :], li)

    @property
    def nbytes(self) -> int:
        return sum(int(k.nbytes + v.nbytes) for k, v in self.layers)

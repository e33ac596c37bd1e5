"""A causal LM stepped through its KV cache, with roll-back: what speculative decoding drives.

:class:`CachedLM` is the small protocol the speculative loop (:mod:`latencylab.gen.speculative`) and the
model drafts (:mod:`latencylab.gen.drafts`) share: ``reset()`` starts an empty cache, ``forward(ids, keep)``
appends ``ids`` to it and returns the logits of its last ``keep`` positions, ``crop(length)`` rolls the cache
back to its first ``length`` positions (the rejected draft tokens leave it). :class:`HFLM` implements it
for a transformers model with a ``DynamicCache``; a toy model in the tests implements it without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class CachedLM(Protocol):
    """A causal LM with a KV cache that grows by ``forward`` and shrinks by ``crop``."""

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...

    def forward(self, ids: Sequence[int], keep: int) -> Any: ...  # logits, shape [keep, vocab]

    def crop(self, length: int) -> None: ...


def crop_cache(cache: Any, length: int) -> None:
    """Roll a transformers cache back to its first ``length`` positions. ``crop(-n)`` removes n positions
    in every transformers version (a positive argument meant an absolute length before 5.x and is refused
    since)."""
    remove = int(cache.get_seq_length()) - length
    if remove < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
    if remove:
        cache.crop(-remove)


class HFLM:
    """A transformers causal LM (eval mode) behind :class:`CachedLM`: one ``DynamicCache`` per sequence."""

    def __init__(self, model: Any) -> None:
        from latencylab.workloads.gen_decode import _cache_kwarg

        self.model = model
        self.cache: Any = None
        self._kwarg = _cache_kwarg(model)

    @property
    def length(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    def forward(self, ids: Sequence[int], keep: int) -> Any:
        import torch

        if self.cache is None:
            self.reset()
        x = torch.tensor([list(ids)], dtype=torch.long)
        kwargs: dict[str, Any] = {self._kwarg: self.cache, "use_cache": True, "logits_to_keep": keep}
        with torch.inference_mode():
            return self.model(input_ids=x, **kwargs).logits[0, -keep:]

    def crop(self, length: int) -> None:
        if self.cache is not None:
            crop_cache(self.cache, length)

"""Drafts for speculative decoding of SmolLM2 (no smaller model with its tokenizer ships offline).

* :class:`ModelDraft`: any :class:`~latencylab.gen.lm.CachedLM` proposing k tokens one forward each (greedy,
  or drawn from its own warped distribution when sampling), keeping its own KV cache, rolled back to what
  the target accepted. Two models for it, both built from the target:
  :func:`int8_model` (a copy with every Linear layer, the LM head included, dynamically quantised to INT8:
  int8 weights with one scale per tensor, the torch defaults; activations quantised per call;
  :func:`latencylab.gen.quant.quantize`) and :func:`early_exit_model` (the
  target's first n decoder layers, then its final norm and LM head, sharing the target's weights).
* :class:`PromptLookupDraft`: no model. The longest recent n-gram of the context (n from ``max_ngram``
  down to ``min_ngram``) is looked up earlier in the prompt and the text so far; the tokens that followed
  its latest earlier occurrence are proposed. Summaries and rewrites copy spans of their prompt, so it
  costs microseconds and is right exactly there.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.gen.lm import HFLM, CachedLM
from latencylab.gen.speculative import Proposal, Sampler


class ModelDraft:
    """A draft model with its own KV cache: proposes k tokens autoregressively."""

    def __init__(self, lm: CachedLM, name: str) -> None:
        self.lm = lm
        self.name = name

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.lm.reset()

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None) -> Proposal:
        import torch

        # The cache holds a prefix of the context (what survived the last verify); feed the rest at once.
        logits = self.lm.forward(list(context[self.lm.length :]), 1)[-1]
        tokens: list[int] = []
        dists = []
        for i in range(k):
            if sampler is None:
                tok = int(logits.argmax().item())
            else:
                q = sampler.probs(logits)
                tok = sampler.draw(q)
                dists.append(q)
            tokens.append(tok)
            if i < k - 1:
                logits = self.lm.forward([tok], 1)[-1]
        return Proposal(tuple(tokens), torch.stack(dists) if dists else None)

    def rollback(self, length: int) -> None:
        if self.lm.length > length:
            self.lm.crop(length)


class PromptLookupDraft:
    """n-gram lookup in the context (prompt + output so far); no model, no state."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise LatencyLabError(f"prompt lookup: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = f"lookup{max_ngram}"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None) -> Proposal:
        return Proposal(tuple(lookup(context, k, self.max_ngram, self.min_ngram)))

    def rollback(self, length: int) -> None:
        pass


def lookup(context: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the context's last n tokens, for the
    largest n in [min_ngram, max_ngram] that has one; [] when none has."""
    ctx = list(context)
    size = len(ctx)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        pattern = ctx[size - n :]
        first = pattern[0]
        # latest start i < size - n with ctx[i:i+n] == pattern (the suffix itself excluded)
        for i in range(size - n - 1, -1, -1):
            if ctx[i] == first and ctx[i : i + n] == pattern:
                return ctx[i + n : i + n + k]
    return []


def int8_model(model: Any) -> Any:
    """A copy of ``model`` with its Linear layers (LM head included) dynamically quantised to INT8."""
    from latencylab.gen.quant import quantize

    # The LM head shares its weight with the embedding (tied); the quantised head gets its own int8 copy.
    return quantize(model, "dynamic")


def early_exit_model(model: Any, layers: int) -> Any:
    """The target's first ``layers`` decoder layers + its final norm + its LM head: a shallow copy of the
    model sharing every weight, with its own config (``num_hidden_layers = layers``, so that its
    ``DynamicCache`` has that many layers)."""
    import torch

    inner = model.model
    total = len(inner.layers)
    if not 1 <= layers <= total:
        raise LatencyLabError(f"early exit: layers must be in [1, {total}], got {layers}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = layers
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:layers]
    short = copy.copy(inner)
    short._modules = dict(inner._modules)  # a copy.copy shares the submodule dict; this one must not
    short.layers = torch.nn.ModuleList(list(inner.layers)[:layers])
    short.config = cfg
    out = copy.copy(model)
    out._modules = dict(model._modules)
    out.model = short
    out.config = cfg
    return out


def build_draft(spec: str, model: Any) -> Any:
    """A draft from a short spec: ``int8``, ``exit:N`` (first N layers), ``lookup[:N]`` (max n-gram N)."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "int8" and not arg:
            return ModelDraft(HFLM(int8_model(model)), "int8")
        if kind == "exit":
            n = int(arg)
            return ModelDraft(HFLM(early_exit_model(model, n)), f"exit{n}")
        if kind == "lookup":
            return PromptLookupDraft(int(arg) if arg else 3)
    except ValueError as exc:
        raise LatencyLabError(f"draft {spec!r}: {exc}") from exc
    raise LatencyLabError(f"unknown draft {spec!r} (int8 | exit:N | lookup[:N])")

"""The gen workload's fidelity reference: what a faster variant (speculative decoding, INT8, ...) must keep.

Built once from the FP32 model and stored (:func:`reference`, a JSON file beside the converted model):

* **greedy outputs**: the FP32 model's greedy answer (up to ``max_tokens``, stopping at EOS) to each of the
  first prompts of the built-in set (short questions and instructions over passages);
* **perplexity** on held-out corpus text: the corpus's last lines, which no built-in prompt uses,
  ``exp(total negative log-likelihood / predicted tokens)`` with every token after the first predicted.

:func:`score` measures a variant against it: ``prefix_agreement`` (per prompt, the share of the reference
answer the variant's free-running greedy answer reproduces before its first different token; mean over
prompts), ``exact`` (the share of prompts answered identically), ``forced_agreement`` (the reference answers
fed in, teacher-forced: the share of their positions where the variant's top-1 token is the reference's;
not thrown off by one early divergence) and the variant's perplexity on the same held-out text. A lossless
transform (speculative decoding, greedy) scores 1, 1, 1 and the same perplexity.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.workloads.gen_decode import DecodeConfig, eos_ids, generate

FIDELITY_VERSION = 1
KIND = "gen-fidelity-reference"
Generate = Callable[[Sequence[int], int], Sequence[int]]  # (prompt ids, max_tokens) -> output ids


@dataclass(frozen=True, slots=True)
class Reference:
    """FP32 greedy outputs for fixed prompts and the FP32 perplexity on held-out text (token ids stored, so
    a variant is scored on exactly the same tokens)."""

    key: str
    max_tokens: int
    prompts: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]
    texts: tuple[tuple[int, ...], ...]
    perplexity: float
    version: int = FIDELITY_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "version": self.version, "key": self.key, "max_tokens": self.max_tokens,
            "perplexity": self.perplexity, "prompts": [list(p) for p in self.prompts],
            "outputs": [list(o) for o in self.outputs], "texts": [list(t) for t in self.texts],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reference:
        if d.get("kind") != KIND:
            raise LatencyLabError(f"not a {KIND} document (kind {d.get('kind')!r})")
        return cls(
            key=str(d["key"]), max_tokens=int(d["max_tokens"]),
            prompts=tuple(tuple(int(x) for x in p) for p in d["prompts"]),
            outputs=tuple(tuple(int(x) for x in o) for o in d["outputs"]),
            texts=tuple(tuple(int(x) for x in t) for t in d["texts"]),
            perplexity=float(d["perplexity"]), version=int(d.get("version", 0)),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class FidelityScore:
    """A variant against the reference (fractions 0-1; perplexities as exp of the mean NLL)."""

    prefix_agreement: float
    exact: float
    forced_agreement: float
    perplexity: float
    reference_perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity / self.reference_perplexity

    def to_dict(self) -> dict[str, float]:
        return {
            "prefix_agreement": self.prefix_agreement, "exact": self.exact,
            "forced_agreement": self.forced_agreement, "perplexity": self.perplexity,
            "reference_perplexity": self.reference_perplexity, "perplexity_ratio": self.perplexity_ratio,
        }  # fmt: skip


def heldout_ids(tok: Any, count: int = 32, max_len: int = 128) -> list[list[int]]:
    """The corpus's last ``count`` lines as token ids (each cut to ``max_len``): text no prompt uses."""
    from latencylab.workloads.text import corpus

    lines = corpus()[-count:]
    return [list(tok(line)["input_ids"])[:max_len] for line in lines]


def perplexity(model: Any, seqs: Sequence[Sequence[int]]) -> float:
    """exp(total NLL / predicted tokens) of ``seqs``, each token predicted from those before it."""
    import torch

    nll, n = 0.0, 0
    with torch.inference_mode():
        for seq in seqs:
            if len(seq) < 2:
                continue
            ids = torch.tensor([list(seq)], dtype=torch.long)
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            n += len(seq) - 1
    if n == 0:
        raise LatencyLabError("perplexity: no text of 2 tokens or more")
    return math.exp(nll / n)


def forced_agreement(model: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> float:
    """Teacher-forced top-1 agreement with ``outputs`` over all their positions."""
    import torch

    hit, n = 0, 0
    with torch.inference_mode():
        for p, o in zip(prompts, outputs, strict=True):
            full = torch.tensor([list(p) + list(o)], dtype=torch.long)
            logits = model(input_ids=full, use_cache=False).logits[0, len(p) - 1 : len(p) + len(o) - 1]
            hit += int((logits.argmax(-1) == torch.tensor(list(o))).sum())
            n += len(o)
    return hit / n if n else 1.0


def _greedy(tok: Any, model: Any) -> Generate:
    eos = eos_ids(tok, model)
    return lambda ids, n: generate(model, ids, n, DecodeConfig(), eos)


def build_reference(
    tok: Any, model: Any, *, key: str, max_tokens: int = 32, prompts: int = 16, texts: int = 32
) -> Reference:
    """The reference from ``model`` (the FP32 one): greedy answers to the first ``prompts`` built-in prompts
    (chat-templated) and the perplexity on ``texts`` held-out corpus lines."""
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_prompts import builtin_prompts

    ps = [tuple(chat_ids(tok, messages_of(p))) for p in builtin_prompts()[:prompts]]
    gen = _greedy(tok, model)
    outs = [tuple(int(t) for t in gen(p, max_tokens)) for p in ps]
    held = [tuple(s) for s in heldout_ids(tok, texts)]
    return Reference(key, max_tokens, tuple(ps), tuple(outs), tuple(held), perplexity(model, held))


def score(tok: Any, model: Any, ref: Reference, generate_fn: Generate | None = None) -> FidelityScore:
    """``model`` (a variant) against ``ref``; ``generate_fn`` replaces the plain greedy decode loop for the
    free-running answers (a speculative decoder passes its own), the model still gives the logits."""
    gen = generate_fn or _greedy(tok, model)
    shares, exact = [], 0
    for p, o in zip(ref.prompts, ref.outputs, strict=True):
        got = [int(t) for t in gen(p, ref.max_tokens)]
        k = 0
        while k < min(len(got), len(o)) and got[k] == o[k]:
            k += 1
        shares.append(k / len(o) if o else 1.0)
        exact += int(got == list(o))
    return FidelityScore(
        prefix_agreement=sum(shares) / len(shares),
        exact=exact / len(shares),
        forced_agreement=forced_agreement(model, ref.prompts, ref.outputs),
        perplexity=perplexity(model, ref.texts),
        reference_perplexity=ref.perplexity,
    )


def load_or_build_reference(path: Path, build: Callable[[], Reference]) -> Reference:
    """The reference stored at ``path``, or ``build()`` it and store it (atomically: tmp file + rename)."""
    if path.is_file():
        try:
            ref = Reference.from_dict(json.loads(path.read_text()))
            if ref.version == FIDELITY_VERSION:
                return ref
        except (OSError, ValueError, KeyError, TypeError, LatencyLabError):
            pass  # unreadable or older: build again and overwrite
    ref = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(ref.to_dict()))
    os.replace(tmp, path)
    return ref


def reference() -> Reference:
    """The stored reference of the packaged SmolLM2 in FP32 (built on the first call: ~a minute)."""
    from latencylab.workloads.gen_model import cache_root, load_model

    loaded = load_model()
    key = loaded.path.name
    path = cache_root() / f"reference-{key}-v{FIDELITY_VERSION}.json"
    return load_or_build_reference(path, lambda: build_reference(loaded.tokenizer, loaded.model, key=key))

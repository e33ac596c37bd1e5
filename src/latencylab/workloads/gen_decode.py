"""The decode loop of the gen workload: prefill, then one forward per token, each token timed.

Written by hand (the model's ``forward`` with a ``DynamicCache``) rather than through ``generate()``, so
that the clock sees every token: :func:`prefill` runs the prompt through the model once and picks the
first token; :func:`decode` then runs one position per step and picks the next, marking the clock after
each. With the KV cache off (``DecodeConfig.kv_cache=False``) every step runs the whole sequence so far
again, with no cache: the same tokens (greedy), at a cost that grows with the sequence. That is what the
cache saves.

Token choice (:func:`pick`): greedy (argmax) at temperature 0, the default; otherwise temperature
scaling, then nucleus (top-p) filtering, then a draw from a ``torch.Generator`` seeded per request, so
a sampled run is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """How tokens are chosen and whether the KV cache is used."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    kv_cache: bool = True
    ignore_eos: bool = False  # keep going to max_tokens (benchmark tools' fixed-length mode)

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature != self.temperature:
            raise LatencyLabError(f"gen: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise LatencyLabError(f"gen: top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True)
class State:
    """One request in flight: the prompt, the tokens chosen so far, the cache, the sampler's generator."""

    prompt_ids: list[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    cache: Any = None
    generator: Any = None
    step_ns: tuple[int, ...] = ()  # decode's clock timestamps: its start, then after each token
    stop: str = ""  # "eos" | "length"


def pick(logits: Any, cfg: DecodeConfig, generator: Any = None) -> int:
    """The next token from the last position's logits (shape [vocab])."""
    import torch

    if cfg.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = cum - sorted_p >= cfg.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _generator(seed: int | None) -> Any:
    if seed is None:
        return None
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    return g


def new_state(prompt_ids: Sequence[int], max_tokens: int, seed: int | None = None) -> State:
    if max_tokens < 1:
        raise LatencyLabError(f"gen: max_tokens must be >= 1, got {max_tokens} (a request for no tokens has no TTFT)")
    return State(list(prompt_ids), max_tokens, generator=_generator(seed))


_CACHE_KWARG: dict[type, str] = {}


def _cache_kwarg(model: Any) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older, deprecated since), per model class."""
    kind = type(model)
    if kind not in _CACHE_KWARG:
        import inspect

        params = inspect.signature(model.forward).parameters
        _CACHE_KWARG[kind] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[kind]


def _forward(model: Any, ids: Sequence[int], cache: Any, keep_last: bool) -> Any:
    import torch

    x = torch.tensor([list(ids)], dtype=torch.long)
    kwargs: dict[str, Any] = {"use_cache": cache is not None}
    if cache is not None:
        kwargs[_cache_kwarg(model)] = cache
    if keep_last:
        kwargs["logits_to_keep"] = 1  # the prompt's other positions need no vocabulary projection
    return model(input_ids=x, **kwargs).logits[0, -1]


def prefill(model: Any, st: State, cfg: DecodeConfig) -> State:
    """Run the prompt through the model (filling the cache when on) and choose the first output token."""
    import torch

    with torch.inference_mode():
        if cfg.kv_cache:
            from transformers import DynamicCache

            st.cache = DynamicCache(config=model.config)
        logits = _forward(model, st.prompt_ids, st.cache, keep_last=True)
        st.tokens = [pick(logits, cfg, st.generator)]
    return st


def done(st: State, eos: frozenset[int], cfg: DecodeConfig) -> bool:
    if not cfg.ignore_eos and st.tokens and st.tokens[-1] in eos:
        st.stop = "eos"
        return True
    if len(st.tokens) >= st.max_tokens:
        st.stop = "length"
        return True
    return False


def decode(model: Any, st: State, cfg: DecodeConfig, eos: frozenset[int], clock: Clock | None = None) -> State:
    """Choose tokens after the first until EOS (unless ``cfg.ignore_eos``) or ``st.max_tokens``, one forward
    per token; ``st.step_ns`` gets the clock's time at the start and after each token."""
    import torch

    clk = clock or PerfCounterClock()
    mark = clk.mark
    marks = [mark()]
    with torch.inference_mode():
        while not done(st, eos, cfg):
            if cfg.kv_cache:
                logits = _forward(model, st.tokens[-1:], st.cache, keep_last=False)
            else:
                logits = _forward(model, st.prompt_ids + st.tokens, None, keep_last=True)
            st.tokens.append(pick(logits, cfg, st.generator))
            marks.append(mark())
    st.step_ns = tuple(int(t) for t in clk.resolve(marks))
    st.cache = None  # the cache's memory goes back before the next request
    return st


def generate(
    model: Any,
    prompt_ids: Sequence[int],
    max_tokens: int,
    cfg: DecodeConfig | None = None,
    eos: frozenset[int] = frozenset(),
    seed: int | None = None,
) -> list[int]:
    """Prefill + decode in one call: the output token ids (what fidelity scoring compares)."""
    cfg = cfg or DecodeConfig()
    st = prefill(model, new_state(prompt_ids, max_tokens, seed), cfg)
    return decode(model, st, cfg, eos).tokens


def eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """The token ids that end a reply: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)

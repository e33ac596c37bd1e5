"""Decode-step variants the generative search times: a KV cache stored in another dtype, and a
``torch.compile``'d decode step over a static cache.

* :func:`make_cache`: the KV cache of one request. ``fp32`` (or ``model``): transformers' ``DynamicCache``,
  which stores keys and values in the model's dtype; ``bf16``: the same, each layer's keys and values
  stored in bfloat16 and handed back to attention in the model's dtype (half the cache's bytes, one cast a
  step); ``fp8``: transformers' ``QuantizedCache(backend="fp8")`` (float8 e4m3, one scale per tensor frozen
  on the prompt's keys/values; the prompt itself attends in full precision).
* :class:`CompiledStep`: the model's one-token decode forward compiled by ``torch.compile`` (``backend``:
  ``inductor``, or ``eager``/``aot_eager`` for the tests), over a ``StaticCache`` of ``max_len`` positions, so
  every decode step has the same shapes and the graph is compiled once. The prefill (its length varies per
  prompt) runs eagerly into the same static cache. It counts the graphs its backend compiled
  (``graphs``: the first request's are the compile; any later one is a **recompile**) and the clock's
  compile time (:meth:`CompiledStep.warm_up`).
* :func:`generate_plain`: greedy decoding through either, timed like the gen workload's loop
  (:mod:`latencylab.workloads.gen_decode`): TTFT from the start to the first token (prefill), decode time from
  the first token to the last; EOS honoured when ``eos`` is given (none: exactly ``n`` tokens, equal work).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError

KV_DTYPES = ("fp32", "bf16", "fp8")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
_BF16_LAYER: list[type] = []


def _bf16_layer() -> type:
    """A ``DynamicLayer`` that stores its keys and values in bfloat16 (made once: transformers is heavy)."""
    if _BF16_LAYER:
        return _BF16_LAYER[0]
    import torch
    from transformers.cache_utils import DynamicLayer

    class Bf16Layer(DynamicLayer):
        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            k, v = key_states.to(torch.bfloat16), value_states.to(torch.bfloat16)
            if not self.is_initialized:
                self.lazy_initialization(k, v)
            old: tuple[Any, Any] = (self.keys, self.values)
            keys, values = torch.cat([old[0], k], dim=-2), torch.cat([old[1], v], dim=-2)
            self.keys, self.values = keys, values
            return keys.to(key_states.dtype), values.to(value_states.dtype)

    _BF16_LAYER.append(Bf16Layer)
    return Bf16Layer


def make_cache(model: Any, kv_dtype: str = "fp32") -> Any:
    """An empty KV cache for one request of ``model`` storing keys and values as ``kv_dtype`` (module docstring)."""
    from transformers import DynamicCache

    if kv_dtype in ("fp32", "model"):
        return DynamicCache(config=model.config)
    if kv_dtype == "bf16":
        cache = DynamicCache(config=model.config)
        if any(type(layer).__name__ != "DynamicLayer" for layer in cache.layers):
            raise LatencyLabError("kv bf16: only full-attention models (no sliding-window layers)")
        cache.layers = [_bf16_layer()() for _ in cache.layers]
        return cache
    if kv_dtype == "fp8":
        from transformers import QuantizedCache

        return QuantizedCache(backend="fp8", config=model.config)
    raise LatencyLabError(f"kv dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


def _kwarg(model: Any) -> str:
    from latencylab.workloads.gen_decode import _cache_kwarg

    return _cache_kwarg(model)


class CompiledStep:
    """The one-token decode forward of ``model`` compiled over a static cache of ``max_len`` positions."""

    def __init__(self, model: Any, backend: str = "inductor", max_len: int = 512) -> None:
        import torch

        if backend not in COMPILE_BACKENDS:
            raise LatencyLabError(f"compile backend must be one of {', '.join(COMPILE_BACKENDS)}, got {backend!r}")
        self.model, self.backend, self.max_len = model, backend, max_len
        self.graphs = 0  # graphs the backend compiled (every one after warm_up is a recompile)
        self.warm_graphs = 0
        self.compile_ns = 0
        self._kw = _kwarg(model)
        inner = torch._dynamo.lookup_backend(backend)

        def counting(gm: Any, example_inputs: Any) -> Any:
            self.graphs += 1
            return inner(gm, example_inputs)

        def step(ids: Any, pos: Any, cache: Any) -> Any:
            out = model(input_ids=ids, position_ids=pos, use_cache=True, **{self._kw: cache})
            return out.logits[:, -1]

        self._step = torch.compile(step, backend=counting, dynamic=False)

    @property
    def recompiles(self) -> int:
        return self.graphs - self.warm_graphs

    def new_cache(self) -> Any:
        from transformers import StaticCache

        return StaticCache(config=self.model.config, max_cache_len=self.max_len)

    def prefill(self, ids: Sequence[int], cache: Any) -> Any:
        """The prompt, eagerly, into ``cache``: the last position's logits."""
        import torch

        if len(ids) >= self.max_len:
            raise LatencyLabError(f"compiled decode: prompt of {len(ids)} tokens >= its static cache ({self.max_len})")
        x = torch.tensor([list(ids)], dtype=torch.long)
        return self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{self._kw: cache}).logits[0, -1]

    def __call__(self, token: int, position: int, cache: Any) -> Any:
        import torch

        if position >= self.max_len:
            raise LatencyLabError(f"compiled decode: position {position} is past its static cache ({self.max_len})")
        ids = torch.tensor([[token]], dtype=torch.long)
        return self._step(ids, torch.tensor([[position]], dtype=torch.long), cache)[0]

    def warm_up(self, clock: Clock, prompt: Sequence[int] = (1, 2, 3)) -> int:
        """Compile now (a 3-token prompt, 3 decode steps): the clock's ns, kept in ``compile_ns``."""
        m0 = clock.mark()
        generate_plain(self.model, prompt, 4, frozenset(), clock, step=self)
        m1 = clock.mark()
        t0, t1 = clock.resolve([m0, m1])
        self.compile_ns, self.warm_graphs = int(t1) - int(t0), self.graphs
        return self.compile_ns


def generate_plain(
    model: Any,
    ids: Sequence[int],
    n: int,
    eos: frozenset[int],
    clock: Clock,
    kv_dtype: str = "fp32",
    step: CompiledStep | None = None,
) -> tuple[list[int], int, int]:
    """Greedy, up to ``n`` tokens: (tokens, TTFT ns, decode ns) on ``clock`` (module docstring)."""
    import torch

    if n < 1:
        raise LatencyLabError(f"gen: max_tokens must be >= 1, got {n}")
    mark = clock.mark
    m0 = mark()
    with torch.inference_mode():
        if step is not None:
            cache = step.new_cache()
            logits = step.prefill(ids, cache)
            forward: Callable[[int, int], Any] = lambda t, pos: step(t, pos, cache)  # noqa: E731
        else:
            cache, kw = make_cache(model, kv_dtype), _kwarg(model)
            x = torch.tensor([list(ids)], dtype=torch.long)
            logits = model(input_ids=x, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[0, -1]

            def forward(t: int, pos: int) -> Any:
                y = torch.tensor([[t]], dtype=torch.long)
                return model(input_ids=y, use_cache=True, **{kw: cache}).logits[0, -1]

        tokens = [int(torch.argmax(logits))]
        marks = [mark()]
        while len(tokens) < n and not (eos and tokens[-1] in eos):
            tokens.append(int(torch.argmax(forward(tokens[-1], len(ids) + len(tokens) - 1))))
            marks.append(mark())
    t = [int(x) for x in clock.resolve([m0, *marks])]
    return tokens, t[1] - t[0], t[-1] - t[1]

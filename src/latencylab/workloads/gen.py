"""Built-in ``gen`` workload: SmolLM2-135M-Instruct answering chat prompts, one request per iteration.

Stages per request (the profiler times each; :mod:`latencylab.workloads.gen_decode` holds the loop):

* ``tokenize`` (preprocess): the chat template, then the tokenizer, to prompt token ids;
* ``prefill`` (forward): the prompt through the model, filling the KV cache, up to the first output token;
* ``decode`` (forward): one forward per further token until EOS or ``max_tokens``; the clock is read after
  every token, so each inter-token gap is known (the probe records them: ``itl_ns``);
* ``detokenize`` (postprocess): the output token ids to text.

TTFT, TPOT and ITL are derived from these (``latencylab.gen.profile``; docs/metrics.md, "Generative
profile"). Prompts: the built-in set of :mod:`latencylab.workloads.gen_prompts` (short chat questions to
instructions over corpus passages, each with its own ``max_tokens``), drawn in a seeded shuffled order.

Params: ``max_tokens`` (every request's limit, instead of each prompt's own), ``temperature`` (0 = greedy,
the default), ``top_p`` (1), ``kv_cache`` (on | off), ``ignore_eos`` (0 | 1: always ``max_tokens`` tokens),
``prompts`` (a JSONL file, as ``latencylab load --prompts`` reads), ``roofline`` (on | off: the prefill and
decode placement ``latencylab profile`` prints). The sampling seed of request i is ``--seed`` + i.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions
from latencylab.workloads.gen_decode import DecodeConfig, State, decode, eos_ids, new_state, prefill
from latencylab.workloads.gen_prompts import Prompt, builtin_prompts, check_max_tokens, read_prompts, with_max_tokens

KNOWN_PARAMS = ("max_tokens", "temperature", "top_p", "kv_cache", "ignore_eos", "prompts", "roofline")
ON_OFF = {"on": True, "off": False, "1": True, "0": False, "true": True, "false": False}


@dataclass(frozen=True, slots=True)
class Request:
    """One iteration's input: chat messages, the token limit, the sampling seed."""

    messages: tuple[Mapping[str, Any], ...]
    max_tokens: int
    seed: int
    label: str


def messages_of(p: Prompt) -> tuple[Mapping[str, Any], ...]:
    if p.messages is not None:
        return tuple(p.messages)
    return ({"role": "user", "content": p.prompt or ""},)


def chat_ids(tok: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Prompt token ids: the model's chat template (with the assistant turn opened), then the tokenizer."""
    text = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def context_window(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 2**31)


def model_facts(model: Any) -> dict[str, Any]:
    """What the roofline needs about the model: parameter counts by role and the attention shape."""
    cfg = model.config
    head = model.get_output_embeddings()
    head_params = int(head.weight.numel()) if head is not None else 0
    layer_linear = 0
    for name, mod in model.named_modules():
        if name.startswith("model.layers.") and hasattr(mod, "weight") and getattr(mod.weight, "ndim", 0) == 2:
            layer_linear += int(mod.weight.numel())
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    n_heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
    dtype_bytes = next(model.parameters()).element_size()
    return {
        "parameters": int(params),
        "layer_linear_params": layer_linear,
        "lm_head_params": head_params,
        "weight_bytes": int(sum(p.numel() * p.element_size() for p in model.parameters())),
        "dtype_bytes": int(dtype_bytes),
        "layers": int(cfg.num_hidden_layers),
        "hidden": int(cfg.hidden_size),
        "heads": n_heads,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or n_heads),
        "head_dim": head_dim,
        "vocab": int(cfg.vocab_size),
        "context_window": context_window(model),
    }


def check_fits(label: str, prompt_tokens: int, max_tokens: int, window: int) -> None:
    """A prompt plus its output must fit the context window (as vLLM refuses a request that does not)."""
    if prompt_tokens + max_tokens > window:
        raise LatencyLabError(
            f"gen: prompt {label!r} is {prompt_tokens} tokens; with max_tokens {max_tokens} it needs "
            f"{prompt_tokens + max_tokens} positions, more than the model's context window of {window}"
        )


def gen_pipeline(
    tok: Any,
    model: Any,
    prompts: Sequence[Prompt],
    cfg: DecodeConfig | None = None,
    *,
    seed: int = 0,
    clock: Clock | None = None,
    name: str = "gen",
    metadata: Mapping[str, Any] | None = None,
) -> Pipeline:
    """The gen Pipeline over ``prompts`` with ``(tok, model)``; ``clock`` times the decode steps (the
    profiler's clock: pass the same one, e.g. a FakeClock in tests). Refuses, before anything runs, a
    prompt that does not fit the context window with its ``max_tokens``."""
    cfg = cfg or DecodeConfig()
    if not prompts:
        raise LatencyLabError("gen: no prompts")
    window = context_window(model)
    lengths = []
    for p in prompts:
        check_max_tokens(p.max_tokens, f"gen: prompt {p.label!r}")
        n = len(chat_ids(tok, messages_of(p)))
        check_fits(p.label, n, p.max_tokens, window)
        lengths.append(n)
    order = np.random.default_rng(seed).permutation(len(prompts)).tolist()
    eos = eos_ids(tok, model)
    last: dict[str, State] = {}

    def source(i: int) -> Request:
        p = prompts[order[i % len(order)]]
        return Request(messages_of(p), p.max_tokens, seed + i, p.label)

    def tokenize(req: Request) -> State:
        return new_state(chat_ids(tok, req.messages), req.max_tokens, None if cfg.greedy else req.seed)

    def run_prefill(st: State) -> State:
        return prefill(model, st, cfg)

    def run_decode(st: State) -> State:
        last["state"] = decode(model, st, cfg, eos, clock)
        return st

    def detokenize(st: State) -> str:
        return str(tok.decode(st.tokens, skip_special_tokens=True))

    def probe(i: int) -> dict[str, Any]:
        """The request's token counts and every inter-token gap of its decode (untimed)."""
        st = last["state"]
        return {
            "prompt_tokens": len(st.prompt_ids),
            "output_tokens": len(st.tokens),
            "itl_ns": np.diff(np.asarray(st.step_ns, dtype=np.int64)).tolist(),
            "stop": st.stop,
            "prompt": prompts[order[i % len(order)]].label,
        }

    srt = sorted(lengths)
    limits = sorted(p.max_tokens for p in prompts)
    meta: dict[str, Any] = {
        "generative": True,
        "model": getattr(model.config, "_name_or_path", "") or type(model).__name__,
        **model_facts(model),
        "batch_size": 1,
        "kv_cache": cfg.kv_cache,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "ignore_eos": cfg.ignore_eos,
        "eos_ids": sorted(eos),
        "prompts": len(prompts),
        "prompt_tokens": {"min": srt[0], "p50": srt[len(srt) // 2], "max": srt[-1]},
        "max_tokens": {"min": limits[0], "p50": limits[len(limits) // 2], "max": limits[-1]},
        "decode_clock": (clock.name if clock is not None else "perf_counter_ns"),
    }
    meta.update(metadata or {})
    pipe = Pipeline(name, source=source, probe=probe, metadata=meta)
    pipe.stage("tokenize", tokenize, kind="preprocess")
    pipe.stage("prefill", run_prefill, kind="forward")
    pipe.stage("decode", run_decode, kind="forward")
    pipe.stage("detokenize", detokenize, kind="postprocess")
    return pipe


def _flag(opts: WorkloadOptions, key: str, default: bool) -> bool:
    raw = opts.params.get(key)
    if raw is None:
        return default
    if raw.lower() not in ON_OFF:
        raise LatencyLabError(f"gen: {key} must be on or off, got {raw!r}")
    return ON_OFF[raw.lower()]


def _float(opts: WorkloadOptions, key: str, default: float) -> float:
    raw = opts.params.get(key)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise LatencyLabError(f"gen: {key} must be a number, got {raw!r}") from exc


def parse(opts: WorkloadOptions) -> tuple[DecodeConfig, int | None]:
    """(decode config, max_tokens override) from ``opts.params``: every bad value is one error line."""
    unknown = set(opts.params) - set(KNOWN_PARAMS)
    if unknown:
        raise LatencyLabError(f"unknown gen param(s) {sorted(unknown)}; known: {list(KNOWN_PARAMS)}")
    if opts.batch_size != 1:
        raise LatencyLabError("gen: batch size 1 only (one request per iteration; batching decode is the server's)")
    if opts.device != "cpu":
        raise LatencyLabError(f"gen: runs on the CPU only, not {opts.device!r}")
    max_tokens = None
    if "max_tokens" in opts.params:
        raw = opts.params["max_tokens"]
        try:
            value = int(raw)
        except ValueError as exc:
            raise LatencyLabError(f"gen: max_tokens must be a whole number >= 1, got {raw!r}") from exc
        max_tokens = check_max_tokens(value, "gen")
    cfg = DecodeConfig(
        temperature=_float(opts, "temperature", 0.0),
        top_p=_float(opts, "top_p", 1.0),
        kv_cache=_flag(opts, "kv_cache", True),
        ignore_eos=_flag(opts, "ignore_eos", False),
    )
    _flag(opts, "roofline", True)  # checked here, used by the profile front end
    return cfg, max_tokens


def build(opts: WorkloadOptions) -> Pipeline:
    from latencylab.workloads.gen_model import MODEL_NAME, load_model

    cfg, max_tokens = parse(opts)
    path = opts.params.get("prompts")
    prompts = read_prompts(path) if path else builtin_prompts()
    if max_tokens is not None:
        prompts = with_max_tokens(prompts, max_tokens)
    loaded = load_model()
    return gen_pipeline(
        loaded.tokenizer,
        loaded.model,
        prompts,
        cfg,
        seed=opts.seed,
        metadata={"model": MODEL_NAME, "weights": loaded.source, "converted": str(loaded.path),
                  "load_s": round(loaded.load_s, 2), "prompt_file": path},
    )  # fmt: skip

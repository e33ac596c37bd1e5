"""The candidates of ``latencylab optimize --workload gen``: variants of a causal LM, each generating tokens.

A generative candidate is not a feed -> array function like the encoder search's (:mod:`.types`): its unit
of work is a request (prompt ids -> output tokens) and its latency is two figures, TTFT and TPOT. So it has
its own small contract, in the same shape:

* :class:`GenInputs`: held-out prompts for fidelity and for timing, held-out text for perplexity,
  calibration text for the sensitivity ranking only (disjoint from the held-out text), the EOS ids;
* :class:`GenCandidate`: a name, a family, the ``params`` that rebuild it (they go into the recipe),
  whether it is **exact by construction** (greedy speculative decoding of the FP32 model: its output is
  the FP32 model's greedy output token for token), and a reason when it cannot run here;
* :class:`GenRunner` (built by :func:`build` from the params): ``generate(ids, n, eos) -> GenRun`` with the
  clock's TTFT (prefill) and decode time, and ``model``, the module whose logits fidelity scores.

``params``: ``weights`` (``fp32`` or a :data:`latencylab.gen.quant.METHODS` INT8 method), ``keep_float``
(the k Linear layers :func:`latencylab.gen.quant.sensitivity` ranks most harmed, left FP32) or ``keep:
"screen"`` (the groups :func:`latencylab.gen.quant.screen` finds, end to end on the calibration text, left
FP32; ``"screen-validated"``: ranked on the calibration text, each kept only if it helps on the validation
text; ``"kind:<proj>"``: every layer of that projection kind, e.g. ``kind:down_proj``), ``smooth``
(``{"alpha", "targets"}``: :func:`latencylab.gen.smooth.smooth` folded in before the INT8 copy),
``dtype`` (``fp32`` | ``bf16``: the weights and the compute of an FP32-weights variant), ``kv_dtype``
(:data:`latencylab.gen.decode_variants.KV_DTYPES`: how the KV cache stores keys and values), ``compile``
(a ``torch.compile`` backend for the decode step, :class:`latencylab.gen.decode_variants.CompiledStep`;
its compile time is timed at build and reported, its recompiles counted), ``threads``, and for speculative
decoding ``draft`` (``lookup`` | ``int8``, :func:`latencylab.gen.drafts.build_draft`) and ``k`` (drafted
tokens per verify step).

Fidelity of a KV-dtype or compiled candidate: its answers run through its own cache and step, so token
agreement and exact see them; top-1 and perplexity are teacher-forced without a cache, through the eager
model, so they see only its weights (equal to FP32's for a KV dtype or a compiled FP32 step).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError

Ids = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GenInputs:
    """Token ids of everything the search runs; ``labels`` name the prompts in the report."""

    fidelity_prompts: tuple[Ids, ...]
    timing_prompts: tuple[Ids, ...]
    texts: tuple[Ids, ...]  # held-out text: perplexity
    calibration: tuple[Ids, ...]  # sensitivity ranking only, never scored
    eos: frozenset[int] = frozenset()
    labels: Mapping[str, Sequence[str]] = field(default_factory=dict)
    validation: tuple[Ids, ...] = ()  # judges the screen's keep: neither calibration nor held-out text

    def __post_init__(self) -> None:
        if not self.fidelity_prompts or not self.timing_prompts or not self.texts:
            raise LatencyLabError("gen search: needs fidelity prompts, timing prompts and held-out text")
        if set(self.texts) & set(self.calibration):
            raise LatencyLabError("gen search: the calibration text overlaps the held-out text")
        if set(self.validation) & (set(self.texts) | set(self.calibration)):
            raise LatencyLabError("gen search: the validation text overlaps the calibration or held-out text")


@dataclass(slots=True)
class GenContext:
    """What candidates are built from: the FP32 model, the inputs, the baseline's threads, the clock."""

    model: Any
    inputs: GenInputs
    threads: int = 1
    clock: Clock = field(default_factory=PerfCounterClock)
    cache: dict[str, Any] = field(default_factory=dict)

    def ranked(self, method: str) -> tuple[tuple[str, float], ...]:
        """:func:`latencylab.gen.quant.sensitivity` of the FP32 model on the calibration text, once per method."""
        key = f"sensitivity:{method}"
        if key not in self.cache:
            from latencylab.gen.quant import sensitivity

            set_threads(self.threads)
            self.cache[key] = sensitivity(self.model, self.inputs.calibration, method)
        return tuple(self.cache[key])

    def screened(self, method: str, smooth: Mapping[str, Any] | None = None, judged: bool = False) -> Any:
        """:func:`latencylab.gen.quant.screen` of the FP32 model (or its :meth:`smoothed` copy) on the
        calibration text, once per method; ``judged``: the keep judged on the validation text."""
        key = f"screen:{method}:{sorted((smooth or {}).items())}:{judged}"
        if key not in self.cache:
            from latencylab.gen.quant import screen

            if judged and not self.inputs.validation:
                raise LatencyLabError("a screen judged on validation text needs validation text (none given)")
            set_threads(self.threads)
            model = self.smoothed(smooth) if smooth else self.model
            judge = self.inputs.validation if judged else None
            self.cache[key] = screen(model, self.inputs.calibration, method, judge=judge)
        return self.cache[key]

    def smoothed(self, smooth: Mapping[str, Any]) -> Any:
        """:func:`latencylab.gen.smooth.smooth` of the FP32 model on the calibration text (``smooth``:
        ``alpha``, ``targets``), once per setting."""
        alpha, targets = float(smooth.get("alpha", 0.5)), tuple(smooth.get("targets", ("down",)))
        key = f"smooth:{alpha}:{targets}"
        if key not in self.cache:
            from latencylab.gen.smooth import smooth as fold

            set_threads(self.threads)
            self.cache[key] = fold(self.model, self.inputs.calibration, alpha, targets)
        return self.cache[key]


@dataclass(frozen=True, slots=True)
class GenRun:
    """One request: the tokens, the clock's TTFT (start to first token) and decode time (first to last), and
    for speculative decoding the drafts proposed and accepted and the verify steps."""

    tokens: tuple[int, ...]
    ttft_ns: int
    decode_ns: int
    proposed: int = 0
    accepted: int = 0
    steps: int = 0


def set_threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


class GenRunner:
    """A model variant generating greedily: plain (one forward per token) or speculative (a draft proposes
    ``k`` tokens, the model verifies them in one forward)."""

    def __init__(
        self, model: Any, threads: int, clock: Clock, draft: Any = None, k: int = 4, kv_dtype: str = "fp32",
        step: Any = None,
    ) -> None:  # fmt: skip
        self.model, self.threads, self.clock, self.draft, self.k = model, threads, clock, draft, k
        self.kv_dtype, self.step = kv_dtype, step  # step: a CompiledStep
        self.stats: dict[str, Any] = {}
        self._target: Any = None
        if draft is not None:
            from latencylab.gen.lm import HFLM

            self._target = HFLM(model)

    def generate(self, ids: Sequence[int], n: int, eos: frozenset[int] = frozenset()) -> GenRun:
        """Greedy, up to ``n`` tokens, stopping after an ``eos`` token (none: exactly ``n``: equal work)."""
        set_threads(self.threads)  # outside the timed span
        if self.draft is not None:
            from latencylab.gen.speculative import speculative_generate

            r = speculative_generate(self._target, self.draft, ids, n, k=self.k, eos=eos, clock=self.clock)
            return GenRun(r.tokens, r.prefill_ns, r.decode_ns, r.proposed, r.accepted, len(r.steps))
        if self.step is not None or self.kv_dtype != "fp32":
            from latencylab.gen.decode_variants import generate_plain

            toks, ttft, dec = generate_plain(self.model, ids, n, eos, self.clock, self.kv_dtype, self.step)
            return GenRun(tuple(toks), ttft, dec)
        from latencylab.workloads.gen_decode import DecodeConfig, decode, new_state, prefill

        cfg = DecodeConfig(ignore_eos=not eos)
        m0 = self.clock.mark()
        st = decode(self.model, prefill(self.model, new_state(ids, n), cfg), cfg, eos, clock=self.clock)
        t0 = int(self.clock.resolve([m0])[0])
        return GenRun(tuple(st.tokens), st.step_ns[0] - t0, st.step_ns[-1] - st.step_ns[0])

    def live_stats(self) -> dict[str, Any]:
        """``stats`` and what changed while it ran (a compiled step's recompiles)."""
        out = dict(self.stats)
        if self.step is not None:
            out |= {"graphs": self.step.graphs, "recompiles": self.step.recompiles}
        return out

    def close(self) -> None:
        self.model = self.draft = self._target = self.step = None


@dataclass(frozen=True, slots=True)
class GenCandidate:
    name: str
    family: (
        str  # fp32 | int8-dynamic | int8-weight | int8-mixed | bf16 | threads | speculative | compile | kv-dtype | ort
    )
    params: Mapping[str, Any]
    description: str = ""
    exact: bool = False  # lossless by construction: the FP32 model's greedy output, token for token
    skip: str | None = None  # why it cannot run (reported as skipped)


def build(ctx: GenContext, params: Mapping[str, Any]) -> GenRunner:
    """The runner of ``params`` (module docstring) over ``ctx.model``."""
    from latencylab.gen.quant import quantize

    if params.get("runtime") == "ort":  # the model as one ONNX Runtime graph (optimize/gen_ort.py)
        from latencylab.optimize.gen_ort import build_ort

        return build_ort(ctx, params)  # type: ignore[return-value]  # GenRunner's interface

    weights, dtype = str(params.get("weights", "fp32")), str(params.get("dtype", "fp32"))
    threads = int(params.get("threads", ctx.threads))
    model, stats = ctx.model, dict[str, Any]()
    if dtype not in ("fp32", "bf16") or (dtype == "bf16" and weights != "fp32"):
        raise LatencyLabError(f"dtype {dtype!r}: fp32, or bf16 of FP32 weights")
    if weights != "fp32":
        keep: list[str] = []
        sm = params.get("smooth")
        source = ctx.smoothed(sm) if sm else ctx.model  # the same function in float (gen/smooth.py)
        if sm:
            stats["smooth"] = dict(sm)
        if params.get("keep") in ("screen", "screen-validated"):
            scr = ctx.screened(weights, sm, params["keep"] == "screen-validated")
            keep = list(scr.kept_layers)
            stats |= {"keep_float_layers": keep, "screen": scr.to_dict()}
        elif str(params.get("keep", "")).startswith("kind:"):
            kind = str(params["keep"])[5:]
            keep = [n for n in _linears(ctx.model) if n.rsplit(".", 1)[-1] == kind]
            if not keep:
                raise LatencyLabError(f"keep {params['keep']!r}: no Linear layer of that kind")
            stats["keep_float_layers"] = keep
        elif int(params.get("keep_float", 0)):
            keep = [name for name, _ in ctx.ranked(weights)[: int(params["keep_float"])]]
            stats["keep_float_layers"] = keep
        model = quantize(source, weights, keep)
    elif dtype == "bf16":
        import copy

        import torch

        model = copy.deepcopy(ctx.model).to(torch.bfloat16).eval()
    step = None
    if params.get("compile"):
        from latencylab.gen.decode_variants import CompiledStep

        set_threads(threads)
        step = CompiledStep(model, str(params["compile"]), int(params.get("max_len", 512)))
        stats["compile_s"] = step.warm_up(ctx.clock) / 1e9
        stats["compile_graphs"] = step.graphs
    draft = None
    if params.get("draft"):
        from latencylab.gen.drafts import build_draft

        draft = build_draft(str(params["draft"]), model)
    kv = str(params.get("kv_dtype", "fp32"))
    runner = GenRunner(model, threads, ctx.clock, draft, int(params.get("k", 4)), kv, step)
    runner.stats = stats
    return runner


def _kv_note(model: Any) -> str:
    cfg = model.config
    layers = int(getattr(cfg, "num_hidden_layers", 0))
    kv = int(getattr(cfg, "num_key_value_heads", 0) or getattr(cfg, "num_attention_heads", 0))
    head = int(getattr(cfg, "head_dim", 0) or cfg.hidden_size // max(1, int(cfg.num_attention_heads)))
    per_pos = layers * 2 * kv * head * 4
    weights = sum(p.numel() for p in model.parameters()) * 4
    return f"{per_pos / 1024:.0f} KiB per position, {100 * 256 * per_pos / weights:.1f}% of the weight bytes at 256"


# SmoothQuant's setting: alpha 0.8 over 0.5 and the LM head's input smoothed too, from a probe of the held-out
# perplexity (docs/benchmarks/optimize-gen.md, session 13): every input smoothed lost less each time
SMOOTH: dict[str, Any] = {"alpha": 0.8, "targets": ["down", "qkv", "gate_up", "head"]}


def candidates(ctx: GenContext, more_threads: int | None = None) -> list[GenCandidate]:
    """The family, the FP32 baseline first. ``more_threads``: one FP32 candidate at that thread count
    (default: 2 when the baseline has 1 and the machine has 2 cores or more)."""
    import importlib.util

    t = ctx.threads
    if more_threads is None:
        more_threads = 2 if t == 1 and (os.cpu_count() or 1) >= 2 else None
    k_mixed = max(1, len(_linears(ctx.model)) // 25)  # ~4% of the layers: 8 of SmolLM2-135M's 211
    out = [
        GenCandidate("fp32", "fp32", {"weights": "fp32", "threads": t}, "FP32 eager, plain greedy decoding (baseline)"),
        GenCandidate("int8-dynamic", "int8-dynamic", {"weights": "dynamic", "threads": t},
                     "torch dynamic INT8 of every Linear, torch defaults (one weight scale per tensor)"),
        GenCandidate("int8-dynamic-perchannel", "int8-dynamic", {"weights": "dynamic-perchannel", "threads": t},
                     "torch dynamic INT8 of every Linear, one weight scale per output channel"),
        GenCandidate(f"int8-dynamic-perchannel-keep{k_mixed}", "int8-mixed",
                     {"weights": "dynamic-perchannel", "keep_float": k_mixed, "threads": t},
                     f"per-channel dynamic INT8, the {k_mixed} Linear layers most harmed (local output error on "
                     "calibration text) kept FP32"),
        GenCandidate("int8-weight", "int8-weight", {"weights": "weight", "threads": t},
                     "weight-only INT8 per output channel, FP32 activations (torch._weight_int8pack_mm)"),
        GenCandidate("spec-lookup-k4", "speculative", {"weights": "fp32", "threads": t, "draft": "lookup", "k": 4},
                     "greedy speculative decoding of the FP32 model, prompt-lookup draft (n-grams of the context), "
                     "k=4", exact=True),
        GenCandidate("spec-int8-k3", "speculative", {"weights": "fp32", "threads": t, "draft": "int8", "k": 3},
                     "greedy speculative decoding of the FP32 model, draft: its dynamic INT8 copy, k=3", exact=True),
    ]  # fmt: skip
    from latencylab.optimize.gen_ort import ort_skip

    no_ort = ort_skip(ctx.model)
    out += [  # early: the search's time cap cuts the list's tail
        GenCandidate("ort-fp32", "ort", {"runtime": "ort", "bits": 0, "threads": t},
                     "the model as one ONNX Runtime graph with its K/V cache (q/k/v and gate/up MatMuls fused), FP32",
                     skip=no_ort),
        GenCandidate("ort-fp32-lookup-k4", "ort", {"runtime": "ort", "bits": 0, "draft": "lookup", "k": 4,
                     "threads": t},
                     "ort-fp32 with greedy speculative decoding: prompt-lookup drafts (k=4) verified as a chunk of "
                     "the graph's forward (the graph's own greedy output by construction)", skip=no_ort),
        GenCandidate("ort-fp32-int8draft-k4", "ort", {"runtime": "ort", "bits": 0, "draft": "ort-int8", "k": 4,
                     "threads": t},
                     "ort-fp32 with greedy speculative decoding: its blockwise-INT8 copy (ort-int8-block32) drafts 4 "
                     "tokens, the FP32 graph verifies them in one forward (its own greedy output by construction)",
                     skip=no_ort),
        GenCandidate("ort-fp32-int8draft-k8", "ort", {"runtime": "ort", "bits": 0, "draft": "ort-int8", "k": 8,
                     "threads": t}, "as ort-fp32-int8draft-k4, 8 drafted tokens a verify step", skip=no_ort),
        GenCandidate("ort-int8-block32", "ort", {"runtime": "ort", "bits": 8, "block": 32, "accuracy_level": 4,
                     "threads": t},
                     "one ONNX Runtime graph, every MatMul as MatMulNBits: INT8 weights with a scale and zero point "
                     "per 32 inputs, activations quantised to INT8 per block of 32 in the kernel (accuracy level 4)",
                     skip=no_ort),
        GenCandidate("ort-int4-block32", "ort", {"runtime": "ort", "bits": 4, "block": 32, "accuracy_level": 4,
                     "threads": t},
                     "as ort-int8-block32 with 4-bit weights (llama.cpp's Q4-like bytes)", skip=no_ort),
    ]  # fmt: skip
    if more_threads and more_threads != t:
        out.append(GenCandidate(f"fp32-t{more_threads}", "threads", {"weights": "fp32", "threads": more_threads},
                                f"FP32 eager at {more_threads} threads (the baseline has {t})"))  # fmt: skip
    out += [
        GenCandidate("bf16", "bf16", {"weights": "fp32", "dtype": "bf16", "threads": t},
                     "BF16 weights, compute and KV cache (half the bytes a decode step reads; AVX-512 BF16 "
                     "where the CPU has it)"),
        GenCandidate("int8-dynamic-screen", "int8-mixed",
                     {"weights": "dynamic-perchannel", "keep": "screen", "threads": t},
                     "per-channel dynamic INT8, the layer groups an end-to-end perplexity screen on the calibration "
                     "text finds most harmful (blocks, projection kinds, the LM head) kept FP32, up to half the "
                     "weights"),
        GenCandidate("int8-dynamic-keep-down", "int8-mixed",
                     {"weights": "dynamic-perchannel", "keep": "kind:down_proj", "threads": t},
                     "per-channel dynamic INT8, every block's mlp.down_proj (the activation-outlier input) kept FP32"),
        GenCandidate("int8-smooth", "int8-smooth",
                     {"weights": "dynamic-perchannel", "smooth": dict(SMOOTH), "threads": t},
                     f"SmoothQuant alpha {SMOOTH['alpha']} (down_proj, q/k/v, gate/up and LM head inputs; scales from "
                     "the calibration text folded into up_proj and the norms), then per-channel dynamic INT8"),
        GenCandidate("int8-smooth-keep-down", "int8-smooth",
                     {"weights": "dynamic-perchannel", "smooth": dict(SMOOTH), "keep": "kind:down_proj", "threads": t},
                     f"SmoothQuant alpha {SMOOTH['alpha']} as int8-smooth, every mlp.down_proj kept FP32"),
        GenCandidate("int8-smooth-screen", "int8-smooth",
                     {"weights": "dynamic-perchannel", "smooth": dict(SMOOTH), "keep": "screen-validated",
                      "threads": t},
                     f"SmoothQuant alpha {SMOOTH['alpha']} as int8-smooth, then the perplexity screen: groups "
                     "ranked on the calibration text, each kept only if it helps on validation text (neither "
                     "calibration nor held-out), up to half the weights"),
        GenCandidate("int8-dynamic-screen-validated", "int8-mixed",
                     {"weights": "dynamic-perchannel", "keep": "screen-validated", "threads": t},
                     "per-channel dynamic INT8, the screen's groups ranked on the calibration text and judged on "
                     "validation text kept FP32, up to half the weights"),
        GenCandidate("kv-bf16", "kv-dtype", {"weights": "fp32", "kv_dtype": "bf16", "threads": t},
                     f"FP32 weights, KV cache stored in BF16 ({_kv_note(ctx.model)} in FP32)"),
        GenCandidate("kv-fp8", "kv-dtype", {"weights": "fp32", "kv_dtype": "fp8", "threads": t},
                     "FP32 weights, KV cache stored in float8 e4m3 (transformers' fp8 QuantizedCache, per-tensor "
                     "scale frozen on the prompt)"),
        GenCandidate("compile-decode", "compile", {"weights": "fp32", "compile": "inductor", "threads": t},
                     "torch.compile (inductor) of the FP32 decode step over a static KV cache; prefill eager"),
        GenCandidate("compile-decode-bf16", "compile",
                     {"weights": "fp32", "dtype": "bf16", "compile": "inductor", "threads": t},
                     "torch.compile (inductor) of the BF16 decode step over a static KV cache; prefill eager"),
    ]  # fmt: skip
    quanto = any(importlib.util.find_spec(m) is not None for m in ("optimum", "hqq"))  # optimum.quanto's parent
    out.append(GenCandidate("kv-int8", "kv-dtype", {"kv_dtype": "int8"}, "INT8 KV cache",
        skip=f"not built: transformers' INT8 quantised cache needs optimum-quanto or HQQ (installed: "
        f"{'yes' if quanto else 'no'}); kv-fp8 and kv-bf16 stand for a smaller cache"))  # fmt: skip
    return out


def _linears(model: Any) -> list[str]:
    from latencylab.gen.quant import linear_names

    return linear_names(model)


def from_params(name: str, family: str, params: Mapping[str, Any], exact: bool) -> GenCandidate:
    """A recipe's candidate again (its params rebuild it through :func:`build`)."""
    from latencylab.gen.decode_variants import KV_DTYPES

    if str(params.get("kv_dtype", "fp32")) not in KV_DTYPES:
        raise LatencyLabError(f"{name}: a recipe of a candidate that was never built (kv dtype {params['kv_dtype']})")
    return GenCandidate(name, family, dict(params), "from the recipe", exact)

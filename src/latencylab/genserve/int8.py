"""The quantised standby of the generative ladder: INT8 weights of the same model, and what they cost in fidelity.

Two ways to INT8 (:func:`quantize_int8`), both on a copy of the FP32 model, every ``nn.Linear`` (the attention
and MLP projections and the LM head; the embedding table stays FP32):

* ``dynamic`` (the server's default, ``GenServeConfig.int8_method``): PyTorch's dynamic quantisation
  (``torch.ao.quantization.quantize_dynamic``: qint8 weights per tensor, activations quantised per batch at
  run time, INT8 GEMMs). Measured here 2.3-3x faster per decode step than FP32, but it loses most of
  SmolLM2's greedy answers (a 135M model's activations have outliers that one 8-bit scale per batch
  flattens): docs/genserve.md has the numbers.
* ``weight``: **weight-only INT8**, per output channel (a scale per row, symmetric, round to nearest),
  computed by ``torch._weight_int8pack_mm`` (INT8 weights, FP32 activations: gpt-fast's int8 mode). Nearly
  FP32's perplexity, but this torch build's CPU kernel is slower than FP32 here (0.6x at batch 1, 0.16x at
  batch 8): no use as a lighter rung on this machine, kept for machines where the kernel pays.

:func:`int8_fidelity` scores the copy with the gen workload's own scorer (workloads/gen_fidelity.py: greedy
prefix agreement and exact answers against the FP32 reference on 16 prompts, teacher-forced top-1 agreement,
perplexity on held-out text) and stores the score beside the reference, keyed by the converted model and the
method: ``python -m latencylab.genserve.int8 [--method dynamic|weight]`` measures and prints it, and a server
with an ``int8`` rung shows the stored score (it does not spend its CPU measuring).
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from typing import Any

from latencylab.workloads.gen_fidelity import FIDELITY_VERSION, FidelityScore

__all__ = ["METHODS", "int8_fidelity", "quantize_int8", "stored_fidelity"]

METHODS = ("weight", "dynamic")


def _weight_only_linear(lin: Any) -> Any:
    from latencylab.gen.quant import WeightOnlyInt8Linear  # (imports torch)

    return WeightOnlyInt8Linear(lin)


def quantize_int8(model: Any, method: str = "dynamic") -> Any:
    """An INT8 copy of ``model`` (its ``nn.Linear`` layers, by ``method``: the module docstring); ``model`` is
    left as it is."""
    import torch

    if method not in METHODS:
        raise ValueError(f"int8 method must be one of {', '.join(METHODS)}, got {method!r}")
    q = copy.deepcopy(model)
    if method == "dynamic":
        with warnings.catch_warnings():  # torch.ao's deprecation notice (torchao is not installed here)
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(q, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        if getattr(q.config, "tie_word_embeddings", False):  # the LM head gets its own INT8 copy; the
            q.config.tie_word_embeddings = False  # embedding table keeps the FP32 one
        for module in list(q.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, _weight_only_linear(child))
    q.eval()
    return q


def _score_path(key: str, method: str) -> Any:
    from latencylab.workloads.gen_model import cache_root

    return cache_root() / f"int8-{method}-fidelity-{key}-v{FIDELITY_VERSION}.json"


def stored_fidelity(key: str, method: str = "dynamic") -> FidelityScore | None:
    """The score :func:`int8_fidelity` stored for ``key`` and ``method``, if any (the server reads it; measuring
    takes minutes of CPU a server should spend on its requests)."""
    path = _score_path(key, method)
    try:
        doc = json.loads(path.read_text())
        return FidelityScore(**{k: v for k, v in doc.items() if k != "perplexity_ratio"})
    except (OSError, ValueError, TypeError):
        return None


def int8_fidelity(tokenizer: Any, fp32: Any, int8: Any, key: str, method: str = "dynamic") -> FidelityScore:
    """The INT8 copy scored against the FP32 reference (built on first use), stored per ``key`` (the converted
    model's directory name) and ``method``."""
    from latencylab.workloads.gen_fidelity import build_reference, load_or_build_reference, score
    from latencylab.workloads.gen_model import cache_root

    stored = stored_fidelity(key, method)
    if stored is not None:
        return stored
    root = cache_root()
    path = _score_path(key, method)
    ref = load_or_build_reference(
        root / f"reference-{key}-v{FIDELITY_VERSION}.json", lambda: build_reference(tokenizer, fp32, key=key)
    )
    got = score(tokenizer, int8, ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(got.to_dict()))
    os.replace(tmp, path)
    return got


def _ms_per_token(model: Any, prompt: list[int], batch: int, steps: int = 16) -> float:
    """Median ms per decode step at ``batch`` rows (one prompt repeated), after a warm-up step."""
    import statistics
    import time

    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt] * batch, dtype=torch.long)
        out = model(input_ids=ids, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return statistics.median(times[1:]) * 1e3


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch

    from latencylab.workloads.gen import chat_ids
    from latencylab.workloads.gen_model import load_model

    ap = argparse.ArgumentParser(prog="python -m latencylab.genserve.int8")
    ap.add_argument("--method", choices=METHODS, default="dynamic")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model()
    q = quantize_int8(lm.model, args.method)
    got = int8_fidelity(lm.tokenizer, lm.model, q, lm.path.name, args.method)
    print(f"int8 ({args.method}) against FP32, the gen workload's fidelity scorer:")
    for k, v in got.to_dict().items():
        print(f"  {k:22s} {v:.4f}")
    prompt = chat_ids(lm.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    print(f"decode step, median of 16 ({args.threads} threads): batch  fp32 ms  int8 ms  ratio")
    for b in (1, 8):
        f, i = _ms_per_token(lm.model, prompt, b), _ms_per_token(q, prompt, b)
        print(f"  {b:>5}  {f:7.1f}  {i:7.1f}  {f / i:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The prefill model: the prompt's forward in bfloat16, decode in FP32 (``serve --model gen --prefill-dtype``).

A prefill is compute-bound (a [prompt, hidden] x [hidden, out] matrix product per Linear), a decode step
memory-bound (every weight read for one token a row). On a CPU with native BF16 dot products (AVX512-BF16 or
AMX) oneDNN runs the prefill's products in BF16 at about 3x the FP32 rate: one forward of a 228-token prompt of
SmolLM2-135M on one core of the Zen guest took 850 ms in FP32 and 273 ms in BF16 (docs/benchmarks/generative.md,
session 14). Without those instructions BF16 is emulated and slower than FP32, so ``auto`` picks it only where it
is native and ``bf16`` is refused elsewhere.

The numbers change: the prompt's K/V and the first token come from BF16 arithmetic (then cast to FP32 for the
decode batch), so the reply is no longer FP32 greedy decoding token for token. Its agreement with FP32 is
measured (:func:`token_agreement`) and stated; the default stays ``fp32``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["PREFILL_DTYPES", "native_bf16", "prefill_model", "resolve", "token_agreement"]

PREFILL_DTYPES = ("fp32", "bf16", "auto")


def native_bf16() -> bool:
    """Whether this CPU has BF16 dot-product instructions oneDNN uses (AVX512-BF16 or AMX tiles)."""
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the probes: assume not
        return False


def resolve(dtype: str, native: bool | None = None) -> str:
    """``fp32`` or ``bf16`` for a requested ``--prefill-dtype`` (``auto``: bf16 where native)."""
    if dtype not in PREFILL_DTYPES:
        raise LatencyLabError(f"--prefill-dtype {dtype!r}: choose from {', '.join(PREFILL_DTYPES)}")
    native = native_bf16() if native is None else native
    if dtype == "auto":
        return "bf16" if native else "fp32"
    if dtype == "bf16" and not native:
        raise LatencyLabError(
            "--prefill-dtype bf16: this CPU has no native BF16 instructions (AVX512-BF16 or AMX), where BF16 is "
            "emulated and slower than FP32; use fp32 or auto"
        )
    return dtype


def prefill_model(model: Any, dtype: str) -> Any:
    """A copy of ``model`` for the prefill in ``dtype`` (``resolve``-d), or None for the model itself."""
    if dtype == "fp32":
        return None
    import torch

    return copy.deepcopy(model).to(torch.bfloat16).eval()


def token_agreement(
    model: Any, prompts: Sequence[Sequence[int]], tokens: int, eos: frozenset[int] | None = None, dtype: str = "bf16"
) -> dict[str, Any]:
    """Greedy replies with the prefill in ``dtype`` against FP32 greedy decoding, over ``prompts``, as the gen
    optimize search scores a candidate (optimize/gen_search.py): ``token_agreement`` is per prompt the share of
    the reference reply reproduced before the first different token, mean over prompts; ``identical`` and
    ``first_token_same`` count prompts."""
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.workloads.gen_decode import generate

    engine = TorchEngine(model, prefill_model=prefill_model(model, dtype))
    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=1, prefill_chunk_tokens=1 << 16))
    shares: list[float] = []
    whole = first = 0
    for p in prompts:
        seq = sched.submit(GenRequest(tuple(p), tokens, eos_ids=frozenset(eos or ())))
        while sched.step() is not None:
            pass
        ref = generate(model, list(p), tokens, eos=frozenset(eos or ()))
        n = 0
        for a, b in zip(seq.tokens, ref, strict=False):
            if a != b:
                break
            n += 1
        shares.append(n / len(ref) if ref else 1.0)
        whole += seq.tokens == ref
        first += bool(seq.tokens) and bool(ref) and seq.tokens[0] == ref[0]
    return {
        "dtype": dtype,
        "prompts": len(prompts),
        "tokens": tokens,
        "token_agreement": sum(shares) / len(shares) if shares else None,
        "identical": whole,
        "first_token_same": first,
    }

"""Token-level figures of a ``--workload gen`` profile: TTFT, TPOT, ITL, where the time goes, the roofline.

Pure: reads a :class:`~latencylab.results.ProfileResult` (its ``tokenize``/``prefill``/``decode``/
``detokenize`` stage times and the probe's ``output_tokens``/``prompt_tokens``/``itl_ns`` columns) and
the measured roofs; nothing is timed here. Definitions (docs/metrics.md, "Generative profile"), per
request (one timed iteration):

* TTFT = tokenize + prefill: from the request's start to its first output token;
* E2E = the iteration's end-to-end time (through detokenize);
* TPOT = (E2E - TTFT) / (output tokens - 1), requests with at least 2 output tokens: the load
  generator's definition (:mod:`latencylab.load.token_metrics`), with the profiler's marks for the
  intended send time and the stream's end;
* ITL = every gap between consecutive output tokens (the decode loop's clock marks).

Roofline (:func:`forward_work`): prefill does ``2 x params x prompt tokens`` FLOPs (plus attention) over
one read of the weights: compute-bound for any prompt past a few dozen tokens; a decode step does
``2 x params`` FLOPs over the same weight bytes (plus the KV cache): about 0.5 FLOP/byte in FP32,
memory-bound, so its time per token is the weight bytes over the memory bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.load.token_metrics import TokenArrays
from latencylab.report.terminal import ci_cell, ms_text
from latencylab.results import ProfileResult
from latencylab.roofline.model import RooflinePoint, place

if TYPE_CHECKING:
    from rich.console import Console

    from latencylab.roofline.peaks import Peaks

STAGES = ("tokenize", "prefill", "decode", "detokenize")
TOKEN_QS = (0.5, 0.9, 0.99)
DTYPE_OF_BYTES = {4: "fp32", 2: "bf16", 1: "int8"}


def is_generative(result: ProfileResult) -> bool:
    meta = (result.pipeline or {}).get("metadata") or {}
    return bool(meta.get("generative")) and all(s in result.stage_names for s in STAGES)


def token_arrays(result: ProfileResult) -> TokenArrays:
    """Per request (timed iteration): TTFT, E2E, TPOT, output tokens, and every ITL gap (ns)."""
    if not is_generative(result):
        raise LatencyLabError(f"{result.workload}: not a generative profile (no tokenize/prefill/decode stages)")
    meta = result.iteration_meta
    n_out = np.asarray(meta.get("output_tokens", ()), dtype=np.int64)
    if n_out.size != result.n:
        raise LatencyLabError(f"{result.workload}: the result lacks per-request output token counts")
    ttft = result.stage("tokenize").array() + result.stage("prefill").array()
    e2e = result.end_to_end_ns()
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n_out > 1, (e2e - ttft) / np.maximum(n_out - 1, 1), np.nan).astype(np.float64)
    gaps = [g for row in meta.get("itl_ns", ()) for g in (row or ())]
    return TokenArrays(
        request=np.arange(result.n, dtype=np.int64),
        ttft_ns=ttft.astype(np.int64),
        ttft_uncorrected_ns=ttft.astype(np.int64),  # a profile has no queue: intended = actual start
        e2e_ns=e2e,
        tpot_ns=tpot,
        output_tokens=n_out,
        itl_ns=np.asarray(gaps, dtype=np.int64),
        one_shot=0,
    )


# ------------------------------------------------------------------------------------------------ work


def forward_work(meta: Mapping[str, Any], new: int, past: int, logits: int = 1) -> tuple[float, float]:
    """(FLOPs, bytes) of one forward pass over ``new`` positions after ``past`` cached ones.

    FLOPs: 2 per weight of the decoder layers' matrices per position, 2 per vocabulary-projection weight
    per position whose logits are computed, and attention's QK^T and AV: 4 x heads x head_dim per
    (query, attended key) pair, causal. Bytes: every weight read once (the tied embedding is read whole
    by the vocabulary projection), plus the KV cache read (``past`` positions) and written (``new``)."""
    layers, b = int(meta["layers"]), int(meta["dtype_bytes"])
    d_attn = int(meta["heads"]) * int(meta["head_dim"])
    d_kv = int(meta["kv_heads"]) * int(meta["head_dim"])
    attended = new * past + new * (new + 1) / 2
    flops = 2.0 * meta["layer_linear_params"] * new + 2.0 * meta["lm_head_params"] * logits
    flops += 4.0 * layers * d_attn * attended
    nbytes = float(meta["weight_bytes"]) + layers * 2.0 * d_kv * b * (past + new)
    return flops, nbytes


def phase_work(result: ProfileResult) -> dict[str, tuple[float, float, float]]:
    """``prefill`` and ``decode``: (FLOPs, bytes, seconds) summed over the timed requests."""
    meta = result.pipeline["metadata"]
    kv = bool(meta.get("kv_cache", True))
    prompt = result.iteration_meta.get("prompt_tokens", ())
    n_out = result.iteration_meta.get("output_tokens", ())
    pf = [0.0, 0.0]
    dc = [0.0, 0.0]
    for p, n in zip(prompt, n_out, strict=True):
        f, by = forward_work(meta, int(p), 0)
        pf[0] += f
        pf[1] += by
        for k in range(1, int(n)):  # step k feeds output token k-1 (position p + k - 1) and picks token k
            f, by = forward_work(meta, 1, int(p) + k - 1) if kv else forward_work(meta, int(p) + k, 0)
            dc[0] += f
            dc[1] += by
    return {
        "prefill": (pf[0], pf[1], float(result.stage("prefill").array().sum()) / 1e9),
        "decode": (dc[0], dc[1], float(result.stage("decode").array().sum()) / 1e9),
    }


def roofline_points(result: ProfileResult, peaks: Peaks, threads: int) -> tuple[RooflinePoint, ...]:
    """Prefill and decode placed under this machine's measured roofs (mean work over mean time)."""
    meta = result.pipeline["metadata"]
    dtype = DTYPE_OF_BYTES.get(int(meta.get("dtype_bytes", 4)), "fp32")
    peak, bw = peaks.compute_gflops(dtype, threads), peaks.bandwidth_gbs(threads)
    if peak is None or bw is None:
        return ()
    out = []
    for name, (flops, nbytes, seconds) in phase_work(result).items():
        if flops > 0 and seconds > 0:
            out.append(place(name, dtype, flops, nbytes, seconds, peak, bw, threads=threads))
    return tuple(out)


# ------------------------------------------------------------------------------------------------ summary


@dataclass(frozen=True, slots=True)
class GenProfile:
    """The token-level figures of one gen profile."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    metrics: Mapping[str, stats.Summary | None]  # ttft, tpot, itl, e2e (ns)
    shares: Mapping[str, float]  # stage -> share of the summed end-to-end time
    tokens_per_s: float  # output tokens / summed end-to-end time (one request at a time)
    request_tokens_per_s_p50: float
    kv_cache: bool
    roofline: tuple[RooflinePoint, ...] = ()
    weight_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        def one(s: stats.Summary | None) -> dict[str, Any] | None:
            if s is None:
                return None
            return {"n": s.n, "mean_ms": s.mean / 1e6, "max_ms": s.max / 1e6, **stats.quantiles_ms(s)}

        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            **{m: one(s) for m, s in self.metrics.items()},
            "shares": dict(self.shares),
            "output_tokens_per_s": self.tokens_per_s,
            "request_output_tokens_per_s_p50": self.request_tokens_per_s_p50,
            "kv_cache": self.kv_cache,
            "weight_bytes": self.weight_bytes,
            "roofline": [p.to_dict() for p in self.roofline],
        }


def _summary(values: np.ndarray, label: str, confidence: float, n_boot: int) -> stats.Summary | None:
    if values.size == 0:
        return None
    return stats.summarize(values.astype(np.float64), TOKEN_QS, confidence, n_boot, label=label)


def gen_profile(
    result: ProfileResult,
    peaks: Peaks | None = None,
    threads: int = 1,
    confidence: float = 0.95,
    n_boot: int = 1000,
) -> GenProfile:
    """TTFT/TPOT/ITL/E2E with CIs (the profile's CI method), stage shares, and (with ``peaks``) the
    roofline placement of prefill and decode at ``threads``."""
    arr = token_arrays(result)
    tpot = arr.tpot_ns[~np.isnan(arr.tpot_ns)]
    metrics = {
        "ttft": _summary(arr.ttft_ns, "ttft", confidence, n_boot),
        "tpot": _summary(tpot, "tpot", confidence, n_boot),
        "itl": _summary(arr.itl_ns, "itl", confidence, n_boot),
        "e2e": _summary(arr.e2e_ns, "e2e", confidence, n_boot),
    }
    total = float(arr.e2e_ns.sum())
    shares = {s: stats.share(float(result.stage(s).array().sum()), total) for s in STAGES}
    per_req = arr.output_tokens / np.maximum(arr.e2e_ns, 1) * 1e9
    meta = result.pipeline["metadata"]
    return GenProfile(
        requests=arr.n,
        prompt_tokens=int(sum(int(p) for p in result.iteration_meta.get("prompt_tokens", ()))),
        output_tokens=int(arr.output_tokens.sum()),
        metrics=metrics,
        shares=shares,
        tokens_per_s=float(arr.output_tokens.sum()) / (total / 1e9) if total > 0 else 0.0,
        request_tokens_per_s_p50=float(np.median(per_req)) if arr.n else 0.0,
        kv_cache=bool(meta.get("kv_cache", True)),
        roofline=roofline_points(result, peaks, threads) if peaks is not None else (),
        weight_bytes=int(meta.get("weight_bytes", 0)),
    )


# ------------------------------------------------------------------------------------------------ render


def roofline_lines(points: Sequence[RooflinePoint], weight_bytes: int) -> list[str]:
    out = []
    for p in points:
        line = (
            f"{p.name}: {p.achieved_gflops:.1f} GFLOP/s = {p.share_text()} of the attainable "
            f"{p.attainable_gflops:.1f} ({p.bound}-bound, {p.intensity:.1f} FLOP/B; roofs {p.peak_gflops:.0f} "
            f"GFLOP/s, {p.bandwidth_gbs:.1f} GB/s, {p.threads} thread{'s' if p.threads > 1 else ''})"
        )
        if p.name == "decode" and p.bound == "memory":
            eff = p.bytes / p.seconds / 1e9
            line += (
                f"; {weight_bytes / 1e6:.0f} MB of weights per token, {eff:.1f} GB/s moved = "
                f"{eff / p.bandwidth_gbs:.0%} of the measured bandwidth"
            )
        out.append(line)
    return out


def render_gen(g: GenProfile, console: Console) -> None:
    """The token table (TTFT/TPOT/ITL/E2E percentiles with CIs), where the time goes, the roofline."""
    from rich.table import Table

    table = Table(
        title=(
            f"tokens: {g.requests} requests, {g.prompt_tokens} prompt and {g.output_tokens} output tokens, "
            f"KV cache {'on' if g.kv_cache else 'off'}"
        ),
        caption="ms; \\[low, high] = CI as above; TTFT = tokenize + prefill; TPOT = (E2E - TTFT) / (tokens - 1)",
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("n", justify="right")
    table.add_column("mean", justify="right")
    for q in TOKEN_QS:
        table.add_column(stats.format_q(q), justify="right")
    table.add_column("max", justify="right")
    for name, s in g.metrics.items():
        if s is None:
            table.add_row(name.upper(), "0", *["-"] * (len(TOKEN_QS) + 2))
            continue
        table.add_row(name.upper(), str(s.n), ms_text(s.mean), *(ci_cell(s, q) for q in TOKEN_QS), ms_text(s.max))
    console.print(table)
    parts = ", ".join(f"{k} {v:.1%}" for k, v in g.shares.items())
    console.print(f"where the time goes: {parts}")
    console.print(
        f"output: {g.tokens_per_s:.1f} tokens/s (one request at a time), per request p50 "
        f"{g.request_tokens_per_s_p50:.1f} tokens/s"
    )
    for line in roofline_lines(g.roofline, g.weight_bytes):
        console.print(f"roofline {line}")


def profile_figures(result: ProfileResult, params: Mapping[str, str]) -> GenProfile | None:
    """What ``latencylab profile`` prints after the stage table for a gen result (None for any other):
    the token figures, and the roofline with this machine's measured peaks (cached; measured on the first
    use) unless ``--param roofline=off``."""
    if not is_generative(result):
        return None
    peaks, threads = None, 1
    if params.get("roofline", "on").lower() not in ("off", "0", "false"):
        import torch

        from latencylab.roofline.peaks import load_or_measure

        threads = torch.get_num_threads()
        peaks = load_or_measure(threads=[threads])
    return gen_profile(result, peaks, threads)

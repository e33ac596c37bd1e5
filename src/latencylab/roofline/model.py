"""The roofline: attainable = min(compute peak, bandwidth x arithmetic intensity), and where a run sits under it.

A point is one forward pass (FLOPs, bytes, seconds) placed under the roofs of its dtype and thread count.
Everything here is pure arithmetic on numbers measured elsewhere (peaks.py, flops.py, api.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

LEVERS = ("precision", "fusion", "less padding", "batching", "none")
FAR_BELOW = 0.3  # below this share of the attainable rate, the roofs do not explain the time
PADDING_WORTH_IT = 0.25  # padded share of positions from which removing padding is the lever to name
# A run cannot beat its roof: a share of the attainable rate above this is a measurement error (work counted
# that was not done, a perturbed peak microbenchmark, a time from another machine), never a figure to show.
# The 5% slack covers the noise of the peak and of the time.
MAX_SHARE = 1.05


def attainable_gflops(peak_gflops: float, bandwidth_gbs: float, intensity: float) -> float:
    """The roofline: min(compute roof, bandwidth roof at this intensity); GB/s x FLOP/B = GFLOP/s."""
    return min(peak_gflops, bandwidth_gbs * intensity)


def ridge_point(peak_gflops: float, bandwidth_gbs: float) -> float:
    """The intensity (FLOP/byte) where the two roofs meet: below it a kernel is memory-bound."""
    return peak_gflops / bandwidth_gbs


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    """One forward pass under its roofs. Rates in GFLOP/s (GOP/s for INT8), intensity in FLOP/byte."""

    name: str
    dtype: str
    flops: float
    bytes: float
    seconds: float
    threads: int
    peak_gflops: float  # measured compute roof for dtype x threads
    bandwidth_gbs: float  # measured memory roof for threads
    achieved_gflops: float
    intensity: float
    attainable_gflops: float
    pct_of_attainable: float  # fraction 0-1
    bound: str  # "compute" | "memory"
    lever: str  # one of LEVERS
    lever_reason: str
    theoretical_gflops: float | None = None  # ISA x clock x threads; None when the ISA lacks the dtype
    pct_of_theoretical: float | None = None
    valid: bool = True  # pct_of_attainable <= MAX_SHARE: False marks a measurement error, not a share

    def share_text(self) -> str:
        """The share of the attainable rate as a reader should see it: "63%", or the measurement error."""
        return share_text(self.pct_of_attainable)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RooflinePoint:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True, slots=True)
class LeverContext:
    """What the lever choice looks at besides the point itself."""

    weight_bytes: float | None = None  # the share of bytes that are weights decides precision vs fusion
    padding_fraction: float | None = None
    better_dtype: str | None = None  # a dtype whose roof is higher for this model, and by how much
    better_gain: float = 1.0


def place(
    name: str,
    dtype: str,
    flops: float,
    nbytes: float,
    seconds: float,
    peak_gflops: float,
    bandwidth_gbs: float,
    *,
    threads: int = 1,
    theoretical_gflops: float | None = None,
    context: LeverContext | None = None,
) -> RooflinePoint:
    """Place one run (``flops`` and ``nbytes`` per forward, ``seconds`` per forward) under the roofline."""
    if flops <= 0 or nbytes <= 0 or seconds <= 0 or peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(
            f"roofline: flops, bytes, seconds and roofs must be > 0 (got {flops}, {nbytes}, {seconds}, "
            f"{peak_gflops}, {bandwidth_gbs})"
        )
    achieved = flops / seconds / 1e9
    intensity = flops / nbytes
    att = attainable_gflops(peak_gflops, bandwidth_gbs, intensity)
    bound = "memory" if intensity < ridge_point(peak_gflops, bandwidth_gbs) else "compute"
    pct = achieved / att
    lever, reason = choose_lever(dtype, bound, pct, nbytes, context or LeverContext())
    return RooflinePoint(
        name=name,
        dtype=dtype,
        flops=flops,
        bytes=nbytes,
        seconds=seconds,
        threads=threads,
        peak_gflops=peak_gflops,
        bandwidth_gbs=bandwidth_gbs,
        achieved_gflops=achieved,
        intensity=intensity,
        attainable_gflops=att,
        pct_of_attainable=pct,
        bound=bound,
        lever=lever,
        lever_reason=reason,
        theoretical_gflops=theoretical_gflops,
        pct_of_theoretical=None if not theoretical_gflops else achieved / theoretical_gflops,
        valid=pct <= MAX_SHARE,
    )


def share_text(pct: float) -> str:
    """``pct`` (achieved / attainable) as text: a percentage up to :data:`MAX_SHARE`, above it the verdict
    that the point is a measurement error (never "344%", which no run can reach)."""
    if pct <= MAX_SHARE:
        return f"{pct:.0%}"
    return f"invalid: achieved is {pct:.2f}x the attainable rate (above the roof: a measurement error)"


def choose_lever(dtype: str, bound: str, pct: float, nbytes: float, ctx: LeverContext) -> tuple[str, str]:
    """The one change most likely to move this point, and why (pure; the order of the checks is the policy).

    1. Far below the roof (< 30% of attainable): the time is not in the roofline's terms at all (dispatch,
       small kernels, unfused element-wise ops): **fusion** (torch.compile, ORT graph fusions).
    2. Otherwise the bigger of two work reductions when it is worth >= 1.2x: **less padding** (FLOPs spent
       on padded positions: 1 / (1 - padded share)) or **precision** (a dtype whose roof is higher here).
    3. Memory-bound: weights dominate the bytes -> **precision** (fewer bytes per weight) or, already INT8,
       **batching** (each weight read serves more rows); activations dominate -> **fusion**.
    4. Compute-bound at the roof with nothing cheaper: **batching** cannot help a compute roof; **none**.

    Above the roof (share > :data:`MAX_SHARE`) the figures themselves are wrong: **none**, and why.
    """
    if pct > MAX_SHARE:
        return "none", (
            f"achieved is {pct:.2f}x the attainable rate, above the roof, which no run can do: the work counted, "
            "the time or the measured peak is wrong (re-measure the peaks with refresh=True on an idle machine; "
            "check that the work counted is the work the variant did)"
        )
    if pct < FAR_BELOW:
        return "fusion", (
            f"{pct:.0%} of the attainable rate: the time is outside the roofline's terms (framework dispatch, "
            "small kernels, unfused element-wise ops); fuse operators (torch.compile, ORT graph fusions)"
        )
    pad = ctx.padding_fraction or 0.0
    pad_gain = 1.0 / (1.0 - pad) if pad < 1.0 else 1.0
    if pad >= PADDING_WORTH_IT and pad_gain >= ctx.better_gain:
        return "less padding", (
            f"{pad:.0%} of the input positions are padding: up to {pad_gain:.1f}x less work with padding to "
            "the longest sequence in the batch (or length buckets)"
        )
    if ctx.better_dtype and ctx.better_gain >= 1.2:
        return "precision", f"the {ctx.better_dtype} roof is {ctx.better_gain:.1f}x higher for this model here"
    if bound == "memory":
        weights = ctx.weight_bytes or 0.0
        if weights >= 0.5 * nbytes:
            if dtype != "int8":
                return "precision", f"weights are {weights / nbytes:.0%} of the bytes: fewer bytes per weight"
            return "batching", f"weights are {weights / nbytes:.0%} of the bytes: batching reuses each weight read"
        return "fusion", "activations dominate the bytes: fusing operators keeps them in cache"
    if pct < 0.8:
        return "fusion", f"compute-bound at {pct:.0%} of the roof: the rest is non-GEMM operator time"
    return "none", f"compute-bound at {pct:.0%} of the roof, and no cheaper dtype measured here"

"""Roofline findings: time a workload's forward pass per dtype and place each run under this machine's roofs.

:func:`roofline_findings` is what ``latencylab diagnose --roofline`` calls: it measures (or loads the cached)
peaks, counts the forward pass's FLOPs and bytes, times the FP32, BF16 (``.to(torch.bfloat16)``) and INT8
(``torch.ao.quantization.quantize_dynamic`` on every nn.Linear) forward passes interleaved, and returns
one Finding per dtype plus one comparing the measured peaks with the ISA's theoretical peak.
:func:`place_optimize_result` places every timed variant of an ``optimize`` result document instead.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from latencylab.errors import LatencyLabError, require
from latencylab.findings import Evidence, Finding
from latencylab.roofline.flops import Work, shape_work, workload_work, works_at_lengths
from latencylab.roofline.model import LeverContext, RooflinePoint, attainable_gflops, place
from latencylab.roofline.peaks import Peaks, load_or_measure
from latencylab.roofline.theory import DTYPES, CpuInfo, TheoreticalPeak, read_cpu, theoretical_peaks
from latencylab.threads import TorchThreads

RULE = "roofline"
PEAKS_RULE = "roofline-peaks"
UNIT = {"fp32": "GFLOP/s", "bf16": "GFLOP/s", "int8": "GOP/s"}


@dataclass(frozen=True, slots=True)
class Roofline:
    """Everything one roofline run produced (the benchmark script prints it; findings are built from it)."""

    workload: str
    threads: int
    work: Work
    peaks: Peaks
    cpu: CpuInfo
    theory: Mapping[str, TheoreticalPeak]
    points: tuple[RooflinePoint, ...]
    load_before: float = 0.0  # 1-min load average when the timing started: others' work perturbs the timing


# --------------------------------------------------------------------------------------------- placing


def place_work(
    name: str,
    dtype: str,
    work: Work,
    seconds: float,
    peaks: Peaks,
    threads: int,
    theory: Mapping[str, TheoreticalPeak] | None = None,
) -> RooflinePoint | None:
    """Place one timed forward pass; None when this dtype has no measured peak here."""
    peak = peaks.compute_gflops(dtype, threads)
    bw = peaks.bandwidth_gbs(threads)
    if peak is None or bw is None:
        return None
    att = attainable_gflops(peak, bw, work.intensity(dtype))
    better, gain = None, 1.0
    for other in DTYPES:
        p = peaks.compute_gflops(other, threads)
        if other != dtype and p is not None:
            g = attainable_gflops(p, bw, work.intensity(other)) / att
            if g > gain:
                better, gain = other, g
    ctx = LeverContext(work.weight_bytes(dtype), work.padding_fraction, better, gain)
    th = theory.get(dtype) if theory else None
    return place(
        name,
        dtype,
        work.flops,
        work.bytes(dtype),
        seconds,
        peak,
        bw,
        threads=threads,
        theoretical_gflops=th.gflops(threads) if th else None,
        context=ctx,
    )


def theory_for(peaks: Peaks) -> tuple[CpuInfo, dict[str, TheoreticalPeak]]:
    """This CPU's theoretical peaks, with the clock measured alongside the peaks where cpufreq hides it."""
    cpu = read_cpu(measured_clock_ghz=peaks.clock_ghz)
    return cpu, theoretical_peaks(cpu)


# --------------------------------------------------------------------------------------------- timing


def _variant(model: Any, dtype: str) -> tuple[Any, Callable[[Any], Any]]:
    """(model for dtype, input cast) from the FP32 model (never modified)."""
    torch = _torch()
    if dtype == "fp32":
        return model, lambda t: t
    if dtype == "bf16":
        return copy.deepcopy(model).to(torch.bfloat16), lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t
    if dtype == "int8":
        with warnings.catch_warnings():
            # torch.ao.quantization announces its deprecation on every call; it works in 2.13
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        return q, lambda t: t
    raise LatencyLabError(f"roofline: cannot time dtype {dtype!r}; known: {', '.join(DTYPES)}")


def time_forward(
    model: Any, args: Sequence[Any], dtypes: Sequence[str], threads: int, rounds: int = 5, per_round: int = 4
) -> dict[str, float]:
    """Median seconds per forward for each dtype, timed interleaved (rounds rotate the order, as the optimize
    search does, so that drift on a shared machine hits every dtype alike)."""
    torch = _torch()
    variants = {}
    for d in dtypes:
        m, cast = _variant(model, d)
        variants[d] = (m, tuple(cast(a) for a in args))
    samples: dict[str, list[float]] = {d: [] for d in dtypes}
    with TorchThreads(threads), torch.inference_mode():
        for m, a in variants.values():
            m(*a)  # warm-up: weight packing, first-touch allocations
            m(*a)
        order = list(dtypes)
        for r in range(rounds):
            for d in order[r % len(order) :] + order[: r % len(order)]:
                m, a = variants[d]
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    m(*a)
                    samples[d].append(time.perf_counter() - t0)
    return {d: statistics.median(s) for d, s in samples.items()}


def measure(
    workload: str,
    threads: int | None = None,
    *,
    peaks: Peaks | None = None,
    quick: bool = False,
    refresh: bool = False,
    dtypes: Sequence[str] = DTYPES,
    seq_len: int | None = 128,
    batch_size: int = 1,
) -> Roofline:
    """Peaks (cached), work, and the interleaved timing of ``workload``'s forward pass per dtype."""
    torch = _torch()
    from latencylab.optimize.adapters import adapter_for

    cpu0 = read_cpu()
    n = threads if threads is not None else cpu0.cores
    if n < 1:
        raise LatencyLabError(f"roofline: threads must be >= 1, got {n}")
    if peaks is None:
        peaks = load_or_measure(refresh=refresh, quick=quick, threads=sorted({1, cpu0.cores, n}))
    adapter = adapter_for(workload, seq_len=seq_len, batch_size=batch_size)
    work = workload_work(workload, adapter=adapter)
    feed = adapter.heldout()[0]
    args = [torch.from_numpy(feed[k]) for k in adapter.input_names]
    rounds, per_round = (2, 2) if quick else (5, 4)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    seconds = time_forward(adapter.torch_model(), args, dtypes, n, rounds, per_round)
    cpu, theory = theory_for(peaks)
    points = [place_work(f"{workload} {d}", d, work, seconds[d], peaks, n, theory) for d in dtypes]
    return Roofline(workload, n, work, peaks, cpu, theory, tuple(p for p in points if p is not None), load)


# --------------------------------------------------------------------------------------------- findings


def point_finding(
    p: RooflinePoint, source: str = "live run", work: Work | None = None, load: float | None = None
) -> Finding:
    """One timed forward pass as a finding. A point above its roof (``not p.valid``: share > MAX_SHARE) is
    reported as the measurement error it is: no share of the roof in its title or evidence, no lever."""
    unit = UNIT.get(p.dtype, "GFLOP/s")
    share: Evidence = Evidence("share of attainable", round(p.pct_of_attainable, 4), "fraction")
    if not p.valid:
        share = Evidence("share of attainable", p.share_text())
    ev = [
        Evidence("achieved", round(p.achieved_gflops, 2), unit),
        Evidence("attainable (roofline)", round(p.attainable_gflops, 2), unit),
        share,
        Evidence("arithmetic intensity", round(p.intensity, 3), "FLOP/byte"),
        Evidence("compute roof (measured)", round(p.peak_gflops, 2), unit),
        Evidence("memory roof (measured)", round(p.bandwidth_gbs, 2), "GB/s"),
        Evidence("forward time (median)", round(p.seconds * 1e3, 3), "ms"),
        Evidence("work per forward", round(p.flops / 1e9, 4), "GFLOP"),
        Evidence("bytes per forward", round(p.bytes / 1e6, 3), "MB"),
    ]
    if p.valid and p.theoretical_gflops is not None and p.pct_of_theoretical is not None:
        ev.append(Evidence("share of theoretical peak", round(p.pct_of_theoretical, 4), "fraction"))
    if load is not None:
        ev.append(Evidence("load average (1 min) when timing started", round(load, 2)))
    recommendation = f"{p.lever}: {p.lever_reason}"
    cores = os.cpu_count() or 1
    # the load average counts this process too (about 1 while it loads the model): the rest is others' work
    if load is not None and max(load - 1.0, 0.0) + p.threads > cores + 0.25:
        recommendation += (
            f" (caution: load average {load:.1f} on {cores} CPUs: other processes shared the cores while this ran, "
            "so the time, and the share of the roof, may reflect them rather than the model)"
        )
    details: dict[str, Any] = {"point": p.to_dict()}
    if work is not None:
        details["work"] = work.to_dict()
    if p.valid:
        title = (
            f"{p.name}: {p.achieved_gflops:.1f} {unit} = {p.share_text()} of the attainable "
            f"{p.attainable_gflops:.1f} ({p.bound}-bound, {p.intensity:.1f} FLOP/B); lever: {p.lever}"
        )
    else:
        title = (
            f"{p.name}: measurement error: {p.achieved_gflops:.1f} {unit} computed from the work and the time is "
            f"above the attainable {p.attainable_gflops:.1f} (the measured {p.dtype} roof), which no run can reach"
        )
    return Finding(
        rule=RULE,
        severity="warning" if (p.pct_of_attainable < 0.3 or not p.valid) else "info",
        title=title,
        evidence=tuple(ev),
        recommendation=recommendation,
        source=source,
        details=details,
    )


def peaks_finding(
    peaks: Peaks, cpu: CpuInfo, theory: Mapping[str, TheoreticalPeak], source: str = "live run"
) -> Finding:
    ev: list[Evidence] = []
    parts = []
    for t in peaks.threads:
        for d in DTYPES:
            got = peaks.compute_gflops(d, t)
            th = theory[d].gflops(t) if d in theory else None
            best = peaks.best_method(d, t)
            label = f"{d} {t} thread{'s' if t > 1 else ''}"
            ev.append(Evidence(f"{label} measured ({best.method if best else 'unsupported'})",
                               round(got, 2) if got else "unsupported", UNIT[d]))  # fmt: skip
            ev.append(Evidence(f"{label} theoretical ({theory[d].isa})", round(th, 2) if th else "none", UNIT[d]))
            if got and th and t == 1:
                parts.append(f"{d} {got:.0f}/{th:.0f} ({got / th:.0%})")
        bw = peaks.bandwidth_gbs(t)
        if bw:
            ev.append(Evidence(f"memory bandwidth {t} thread{'s' if t > 1 else ''}", round(bw, 2), "GB/s"))
    clock = f"{cpu.clock_ghz:.2f} GHz ({cpu.clock_source})" if cpu.clock_ghz else "unknown clock"
    return Finding(
        rule=PEAKS_RULE,
        severity="info",
        title=f"measured vs theoretical peak per core at {clock}: " + (", ".join(parts) or "no comparable dtype"),
        evidence=tuple(ev),
        recommendation=(
            "the roofline uses the measured peaks as roofs; a measured peak far below theory means the library "
            "lacks a kernel for this ISA (e.g. BF16 or INT8 emulated) or the machine was busy (re-measure with "
            "refresh=True)"
        ),
        source=source,
        details={"peaks": peaks.to_dict(), "cpu": cpu.to_dict(), "theory": {d: t.to_dict() for d, t in theory.items()}},
    )


def roofline_findings(
    workload: str,
    threads: int | None,
    *,
    peaks: Peaks | None = None,
    quick: bool = False,
    refresh: bool = False,
    dtypes: Sequence[str] = DTYPES,
) -> list[Finding]:
    """Time ``workload`` ("text": batch 1 x 128 tokens; "vision": one 64 x 64 image) in each dtype at
    ``threads`` (None = every usable core) and place it on this machine's roofline."""
    r = measure(workload, threads, peaks=peaks, quick=quick, refresh=refresh, dtypes=dtypes)
    out = [point_finding(p, work=r.work, load=r.load_before) for p in r.points]
    out.append(peaks_finding(r.peaks, r.cpu, r.theory))
    return out


# --------------------------------------------------------------------------------------------- optimize docs


def variant_dtype(candidate: Mapping[str, Any]) -> str:
    """fp32 | bf16 | fp16 | int8 of one optimize candidate, from its params (else its name)."""
    params = candidate.get("params") or {}
    named = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "qint8": "int8", "quint8": "int8"}
    if str(params.get("dtype")) in named:
        return named[str(params["dtype"])]
    if params.get("quantization"):
        return "int8"
    name = str(candidate.get("name", ""))
    for key, d in (("int8", "int8"), ("bf16", "bf16"), ("fp16", "fp16")):
        if key in name:
            return d
    return "fp32"


# (batch size, sequence length) -> the work of one call of that shape
WorkAt = Callable[[int, int], Work]
_SHAPE_WORK: dict[tuple[str, int, int], Work] = {}  # counted once per process: a count takes ~0.2-1 s


def shape_counter(workload: str) -> WorkAt:
    """The work of ``workload``'s model (text) at each (batch, sequence length), counted on first use and
    cached for the process; the model is loaded once, on the first count."""
    loaded: dict[str, Any] = {}

    def at(batch: int, seq_len: int) -> Work:
        key = (workload, batch, seq_len)
        if key not in _SHAPE_WORK:
            if not loaded:
                from latencylab.optimize.adapters import adapter_for

                adapter = adapter_for(workload, batch_size=1)
                loaded["model"], loaded["names"] = adapter.torch_model(), tuple(adapter.input_names)
            _SHAPE_WORK[key] = shape_work(loaded["model"], loaded["names"], batch, seq_len)
        return _SHAPE_WORK[key]

    return at


def processed_shapes(candidate: Mapping[str, Any], batch_size: int) -> tuple[int, Counter[int], float] | None:
    """(batch, calls per processed sequence length, positions per call) that a text variant really ran on
    the primary held-out set, from ``stats.seq_lens`` / ``stats.tokens_per_call`` (after its shape policy);
    None when the document does not record them (older results, vision)."""
    stats = candidate.get("stats") or {}
    lens = [int(x) for x in stats.get("seq_lens") or () if x and int(x) > 0]
    tokens = stats.get("tokens_per_call")
    tokens = float(tokens) if tokens else None
    if lens:
        batch = max(1, round(tokens / statistics.fmean(lens))) if tokens else batch_size
        return batch, Counter(lens), tokens or float(batch * statistics.fmean(lens))
    if tokens:
        return batch_size, Counter([max(1, round(tokens / batch_size))]), tokens
    return None


def place_optimize_result(
    doc: Mapping[str, Any], *, peaks: Peaks | None = None, work: Work | None = None, work_at: WorkAt | None = None
) -> list[RooflinePoint]:
    """Every timed variant (one with a p50) of an ``optimize`` result on the roofline, each credited with
    the work it did and the bytes its dtype moves.

    A text variant's work is the work of its median-length call on the primary held-out set (the call its
    p50 time belongs to, since time grows with length), at the shape that call really ran
    (``stats.seq_lens`` after the variant's shape policy: a variant that trims padding is credited with the
    real tokens only, a padded one with every position); the work at each distinct
    (batch, length) of the document is counted once (``work_at``, default :func:`shape_counter`; see
    :func:`~latencylab.roofline.flops.works_at_lengths`), since attention makes it superlinear in the
    length. Its padded share is 1 - (fewest positions per call any variant of the document ran) / (its
    positions per call). Documents without those stats (older results, vision) are credited with the
    baseline model's work at the document's shape for every variant. ``work`` forces one Work for every
    variant.
    """
    cfg = doc.get("config") or {}
    workload = str(cfg.get("workload", ""))
    if workload not in ("text", "vision"):
        raise LatencyLabError(f"roofline: optimize results of workload {workload!r} cannot be placed (text, vision)")
    model = doc.get("model") or {}
    threads = int(cfg.get("threads", 1))
    batch_size = int(model.get("batch_size") or cfg.get("batch_size") or 1)
    timed = [c for c in doc.get("candidates") or [] if c.get("p50_ms")]
    works: dict[str, Work] = {}
    if work is None and workload == "text":
        shapes = {str(c.get("name")): sh for c in timed if (sh := processed_shapes(c, batch_size)) is not None}
        if shapes:
            at = work_at or shape_counter(workload)
            needed: dict[int, set[int]] = {}
            for batch, lens, _ in shapes.values():
                needed.setdefault(batch, set()).update(lens)
            counted = {b: works_at_lengths(at, b, sorted(ns)) for b, ns in needed.items()}
            fewest = min(tokens for _, _, tokens in shapes.values())
            for name, (batch, lens, tokens) in shapes.items():
                pad = max(0.0, 1.0 - fewest / tokens)
                # the p50 call is the median-length call (time grows with length): its work is the one to
                # divide by the p50 time, not the mean work, which long inputs pull up
                median_len = sorted(lens.elements())[(sum(lens.values()) - 1) // 2]
                works[name] = replace(counted[batch][median_len], padding_fraction=pad)
    if work is None and len(works) < len(timed):  # the document's shape, as the baseline ran it
        seq = model.get("seq_len", cfg.get("seq_len", 128))
        work = workload_work(workload, batch_size, seq)
    if peaks is None:
        peaks = load_or_measure(threads=sorted({1, threads}))
    _, theory = theory_for(peaks)
    out = []
    for c in timed:
        name = str(c.get("name"))
        w = works.get(name, work)
        assert w is not None
        point = place_work(name, variant_dtype(c), w, float(c["p50_ms"]) / 1e3, peaks, threads, theory)
        if point is not None:
            out.append(point)
    return out


def _torch() -> Any:
    return require("torch", "torch")

"""The roofline of this machine and where a workload's forward pass sits under it.

Prints three tables:

1. the CPU and its clock (nominal from /proc/cpuinfo, measured by a dependent-add loop);
2. the measured peaks (GEMM per dtype, memory bandwidth) next to the theoretical peak from the ISA and clock;
3. the workload's forward pass (text: MiniLM, batch 1 x 128 tokens) in FP32, BF16 and INT8 at each thread
   count, placed on the roofline: achieved GFLOP/s, intensity, attainable, share of attainable and of the
   theoretical peak, which roof binds it, and the lever.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/roofline.py [--workload text] [--threads 1 2]
        [--refresh] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from latencylab.results.base import utc_now
from latencylab.roofline.api import UNIT, measure
from latencylab.roofline.peaks import load_or_measure
from latencylab.roofline.theory import DTYPES, read_cpu


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="text", choices=("text", "vision"))
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all)")
    ap.add_argument("--refresh", action="store_true", help="re-measure the peaks instead of using the cache")
    ap.add_argument("--quick", action="store_true", help="small peaks and few timing rounds (smoke test)")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args()

    t0 = time.perf_counter()
    started = utc_now()
    cores = read_cpu().cores
    counts = sorted(set(args.threads or [1, cores]))
    peaks = load_or_measure(refresh=args.refresh, quick=args.quick, threads=sorted({1, cores, *counts}))
    runs = [measure(args.workload, n, peaks=peaks, quick=args.quick) for n in counts]
    cpu, theory = runs[0].cpu, runs[0].theory
    nominal = read_cpu().clock_ghz

    print(f"CPU: {cpu.model_name or '?'} ({cpu.vendor} family {cpu.family} model {cpu.model}), {cpu.cores} cores")
    isa = sorted(cpu.flags & {"avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile"})
    print(f"ISA: {', '.join(isa)}; torch {peaks.machine.get('torch')}, quantized engine "
          f"{peaks.machine.get('quantized_engine')}")  # fmt: skip
    print(f"clock: nominal (/proc/cpuinfo) {_f(nominal, 3)} GHz, measured {_f(peaks.clock_ghz, 3)} GHz; "
          f"theory uses {_f(cpu.clock_ghz, 3)} GHz ({cpu.clock_source})")  # fmt: skip
    print(f"peaks: {'cached' if peaks.created_at < started else 'measured'} "
          f"{peaks.created_at}, {peaks.wall_s:.1f} s to measure{' (quick)' if peaks.quick else ''}")  # fmt: skip

    rows = []
    for t in peaks.threads:
        for d in DTYPES:
            best = peaks.best_method(d, t)
            got = peaks.compute_gflops(d, t)
            th = theory[d].gflops(t)
            others = ", ".join(
                f"{c.method} {_f(c.gflops)}" if c.gflops else f"{c.method} {c.note}"
                for c in peaks.compute
                if c.dtype == d and c.threads == t and c is not best
            )
            rows.append([
                f"{d} ({UNIT[d]})", str(t), _f(got), best.method if best else "unsupported", others,
                _f(th), theory[d].isa, "-" if not (got and th) else f"{got / th:.0%}",
            ])  # fmt: skip
        bw = [b for b in peaks.bandwidth if b.threads == t]
        rows.append([
            "memory (GB/s)", str(t), _f(peaks.bandwidth_gbs(t)), "best of copy/triad",
            ", ".join(f"{b.method} {_f(b.gbs)} ({b.mib} MiB arrays)" for b in bw), "-", "-", "-",
        ])  # fmt: skip
    _table(
        "Measured peaks vs theoretical (ISA x clock x threads)",
        ["roof", "threads", "measured", "method", "other methods", "theoretical", "ISA path", "measured/theory"],
        rows,
    )

    w = runs[0].work
    pad = _f(None if w.padding_fraction is None else 100 * w.padding_fraction, 0)
    per_dtype = ", ".join(f"{d} {w.bytes(d) / 1e6:.1f} MB (weights {w.weight_bytes(d) / 1e6:.1f})" for d in DTYPES)
    print(f"\n{args.workload} forward: {w.flops / 1e9:.3f} GFLOP (FlopCounterMode), padded positions {pad}%; "
          f"bytes per dtype: {per_dtype}")  # fmt: skip
    rows = []
    for r in runs:
        for p in r.points:
            rows.append([
                p.name, str(p.threads), _f(p.seconds * 1e3, 2), _f(p.achieved_gflops), _f(p.intensity, 2),
                _f(p.peak_gflops), _f(p.bandwidth_gbs), _f(p.attainable_gflops), f"{p.pct_of_attainable:.0%}",
                "-" if p.pct_of_theoretical is None else f"{p.pct_of_theoretical:.0%}", p.bound, p.lever,
            ])  # fmt: skip
    header = ["variant", "threads", "p50 ms", "achieved", "FLOP/B", "compute roof", "GB/s roof", "attainable"]
    header += ["% of attainable", "% of theory", "bound", "lever"]
    _table(f"{args.workload} forward pass on the roofline (rates in GFLOP/s; INT8 in GOP/s)", header, rows)
    for r in runs:
        for p in r.points:
            print(f"* {p.name} x{p.threads}: {p.lever}: {p.lever_reason}")
    print("load average (1 min) before each thread count's timing: " + ", ".join(
        f"{r.threads} thread(s) {r.load_before:.2f}" for r in runs))  # fmt: skip
    print(f"\nwall {time.perf_counter() - t0:.1f} s, pid {os.getpid()}")
    if args.json:
        doc: dict[str, Any] = {
            "peaks": peaks.to_dict(),
            "cpu": cpu.to_dict(),
            "theory": {d: t.to_dict() for d, t in theory.items()},
            "work": w.to_dict(),
            "points": [p.to_dict() for r in runs for p in r.points],
        }
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

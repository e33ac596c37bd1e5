"""TVM on MiniLM at a static shape (issue 21): untuned Relax against ONNX Runtime and OpenVINO FP32, same inputs.

The search cannot afford TVM's untuned libraries (seconds per call, and its fidelity pass runs every held-out
input), so this times the FP32 peers side by side on the 128-token passages only: ``ort-fp32`` (the ONNX Runtime
FP32 session of the same export), ``ov-fp32-static`` and ``tvm-relax-static`` (one static shape, 1 x 128),
interleaved (``--rounds`` rounds, each variant ``--calls`` calls a round, the order rotated), at ``--threads``.
Prints p50s, ratios to ONNX Runtime, the fraction of this machine's FP32 roof (2.869 GFLOP a passage), the build
times (TVM's import + compile included) and the largest |difference| to ONNX Runtime's output.
``tvm-relax-static-unfused`` is the same with operator fusion off (FuseOps depth 1): what fusion gives.
``--tune-time S`` adds ``tvm-relax-tuned`` (MetaSchedule, S seconds; see optimize/families/tvm_tune.py);
``--tuned-unfused`` adds the same tuned with fusion off (``tvm-relax-tuned-unfused``, another S seconds): what
fusion gives once the kernels are scheduled; ``--tuned-fast-math`` adds it with Relax's ``FastMathTransform``
(``tvm-relax-tuned-fastmath``: approximate erf/exp/tanh/softmax, another S seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

GFLOP_PER_PASSAGE = 2.869


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--tune-time", type=float, default=0.0)
    ap.add_argument("--tuned-unfused", action="store_true")
    ap.add_argument("--tuned-fast-math", action="store_true")
    args = ap.parse_args()

    from latencylab.optimize.adapters import adapter_for
    from latencylab.optimize.families import onnxruntime as ort_fam
    from latencylab.optimize.families import openvino as ov_fam
    from latencylab.optimize.families import tvm as tvm_fam
    from latencylab.optimize.types import BuildContext
    from latencylab.roofline.peaks import load_or_measure

    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; threads {args.threads}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="tvm-bench-"))
    ctx = BuildContext(adapter=adapter_for("text"), workdir=work, threads=args.threads)
    ctx.cache["tune_time_s"] = args.tune_time
    passages = ctx.input_sets()["passages128"]
    ctx.cache["input_sets"] = {"passages128": passages}  # static: one shape (1 x 128)
    cands = {c.name: c for c in [*ort_fam.candidates(ctx), *ov_fam.candidates(ctx), *tvm_fam.candidates(ctx)]}
    names = ["ort-fp32", "ov-fp32-static", "tvm-relax-static", "tvm-relax-static-unfused"]
    names += ["tvm-relax-tuned"] if args.tune_time > 0 else []
    if args.tune_time > 0 and args.tuned_unfused:
        t = cands["tvm-relax-tuned"]
        unf = tvm_fam.candidate_from_params("tvm-relax-tuned-unfused", t.family, {**t.params, "fuse_max_depth": 1})
        cands[unf.name] = unf
        names.append(unf.name)
    if args.tune_time > 0 and args.tuned_fast_math:
        t = cands["tvm-relax-tuned"]
        fm = tvm_fam.candidate_from_params("tvm-relax-tuned-fastmath", t.family, {**t.params, "fast_math": True})
        cands[fm.name] = fm
        names.append(fm.name)
    runners: dict[str, Any] = {}
    outs: dict[str, np.ndarray] = {}
    for n in names:
        why = cands[n].skip_reason(ctx)
        if why:
            print(f"{n}: skipped: {why}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            r = cands[n].build(ctx)
            outs[n] = r.run(passages[0])  # compiles (and tunes) the static shape
        except Exception as exc:  # a candidate that cannot build says why; the others go on
            print(f"{n}: failed: {str(exc).splitlines()[0]}", flush=True)
            continue
        runners[n] = r
        print(f"{n}: built in {time.perf_counter() - t0:.1f} s; stats {getattr(r, 'stats', {})}", flush=True)
    samples: dict[str, list[float]] = {n: [] for n in runners}
    order = list(runners)
    i = 0
    for rnd in range(args.rounds):
        for n in order[rnd % len(order) :] + order[: rnd % len(order)]:
            for _ in range(args.calls):
                feed = passages[i % len(passages)]
                i += 1
                t0 = time.perf_counter_ns()
                runners[n].run(feed)
                samples[n].append((time.perf_counter_ns() - t0) / 1e6)
    peak = float(load_or_measure(threads=[args.threads]).compute_gflops("fp32", args.threads) or float("nan"))
    base = float(np.median(samples["ort-fp32"])) if "ort-fp32" in samples else None
    print(f"\npassages128, {args.rounds} rounds x {args.calls} calls, interleaved; FP32 roof {peak:.1f} GFLOP/s")
    print(f"{'variant':22s} {'p50 ms':>10s} {'min ms':>10s} {'vs ort-fp32':>12s} {'roof':>6s} {'max|diff|':>10s}")
    for n, s in samples.items():
        p50 = float(np.median(s))
        ratio = f"{base / p50:.3f}x" if base else "-"
        frac = GFLOP_PER_PASSAGE / (p50 / 1e3) / peak
        diff = float(np.abs(outs[n] - outs["ort-fp32"]).max()) if "ort-fp32" in outs else float("nan")
        print(f"{n:22s} {p50:10.2f} {min(s):10.2f} {ratio:>12s} {frac:6.1%} {diff:10.2e}")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

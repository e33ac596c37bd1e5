"""How faithful ONNX Runtime's blockwise INT8/4-bit MatMuls are on SmolLM2, on the gen search's own held-out prompts
*and* on the built-in prompts the search never scores, so that a setting is not picked for luck on six prompts.

For each ``--specs`` entry ``bits:block:accuracy_level[:kinds kept FP32]`` (e.g. ``8:32:4``, ``8:16:4``,
``8:32:4:down``): the FP32 graph (``gen/ort_llama.py``) quantised with ``quantize_matmuls``, scored exactly as
``optimize --workload gen`` scores a candidate (greedy token agreement over the first 24 tokens, identical answers,
forced top-1, perplexity delta on the held-out corpus lines) against the FP32 torch model, on two prompt sets:
``search`` (the search's fidelity prompts 0, 3, 5, 8, 10, 12) and ``other`` (the 10 built-in prompts it does not
score: 1, 2, 4, 6, 7, 9, 11, 13, 14, 15). Also each setting's TPOT on one timing prompt (24 tokens, 1 thread, the
mean of 2 runs after a warm-up; a spot figure, not the search's interleaved rounds).

    LATENCYLAB_CACHE=.cache/latencylab /tmp/lbench .venv/bin/python benchmarks/gen_ort_fidelity.py \\
        [--specs 8:32:4,8:16:4,8:64:4,8:32:4:down,4:32:4] [--tokens 24]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

SETS = {"search": (0, 3, 5, 8, 10, 12), "other": (1, 2, 4, 6, 7, 9, 11, 13, 14, 15)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default="8:32:4,8:16:4,8:64:4,8:32:4:down,4:32:4")
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()

    import torch

    from latencylab.clock import PerfCounterClock
    from latencylab.gen.ort_decode import OrtLM
    from latencylab.gen.ort_llama import export_llama, quantize_matmuls
    from latencylab.optimize.gen_candidates import GenContext, GenRun, GenRunner
    from latencylab.optimize.gen_lab import GenLabConfig, smollm2_subject
    from latencylab.optimize.gen_search import GenFidelity, score
    from latencylab.workloads.gen_fidelity import perplexity

    torch.set_num_threads(1)
    clk = PerfCounterClock()

    class Runner:
        def __init__(self, lm: Any) -> None:
            self.lm, self.model = lm, lm.model

        def generate(self, ids: Any, n: int, eos: frozenset[int] = frozenset()) -> GenRun:
            r = self.lm.generate(ids, n, eos, clk)
            return GenRun(r.tokens, r.ttft_ns, r.decode_ns)

    subjects = {k: smollm2_subject(GenLabConfig(fidelity_prompts=v)) for k, v in SETS.items()}
    model = subjects["search"].model
    refs = {}
    for k, sub in subjects.items():
        ctx = GenContext(model, sub.inputs, 1)
        base = GenRunner(model, 1, clk)
        ref = [base.generate(p, args.tokens, ctx.inputs.eos).tokens for p in ctx.inputs.fidelity_prompts]
        ppl = perplexity(model, ctx.inputs.texts)
        refs[k] = (ctx, ref, ppl, GenFidelity(1, 1, 1, ppl, ppl, args.tokens, len(ref), True))
    work = Path(tempfile.mkdtemp(prefix="gen-ort-fid-"))
    gen, full = export_llama(model, work / "gen.onnx", True), export_llama(model, work / "full.onnx", False)
    timing = subjects["search"].inputs.timing_prompts[1]
    print(
        f"SmolLM2 FP32 reference; {args.tokens} tokens; prompt sets: " + "; ".join(f"{k} {v}" for k, v in SETS.items())
    )
    print(f"{'setting':>16} {'set':>6} {'agreement':>9} {'exact':>6} {'top1':>6} {'ppl delta':>9} {'TPOT ms':>8}")
    for spec in ["fp32", *args.specs.split(",")]:
        t0 = time.time()
        if spec == "fp32":
            g, f = gen, full
        else:
            parts = spec.split(":")
            bits, block, level = int(parts[0]), int(parts[1]), int(parts[2])
            keep = tuple(x for x in (parts[3] if len(parts) > 3 else "").split(",") if x)
            g, f = work / "gq.onnx", work / "fq.onnx"
            quantize_matmuls(gen, g, bits, block, level, keep)
            quantize_matmuls(full, f, bits, block, level, keep)
        lm = OrtLM(g, f, 1, 30, 3, 64)
        lm.generate(timing, args.tokens, frozenset(), clk)
        runs = [lm.generate(timing, args.tokens, frozenset(), clk) for _ in range(2)]
        tpot = sum(r.decode_ns for r in runs) / sum(len(r.tokens) - 1 for r in runs) / 1e6
        for k, (ctx, ref, ppl, bf) in refs.items():
            fid = score(Runner(lm), ctx, ref, ppl, args.tokens, False, bf)
            print(
                f"{spec:>16} {k:>6} {fid.token_agreement:9.3f} {fid.exact:6.2f} {fid.top1:6.3f} "
                f"{fid.ppl_delta * 100:+8.2f}% {tpot:8.1f}",
                flush=True,
            )
        del lm
        print(f"# {spec}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()

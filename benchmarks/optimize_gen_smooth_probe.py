"""Fidelity only (no timing) of session 13's INT8 variants of SmolLM2-135M-Instruct (issue 19): the perplexity
delta vs FP32 on the validation text (corpus lines 108-115, what a setting may be chosen by) and on the search's
held-out text (the corpus's last 16 lines, what the budget judges), for SmoothQuant alpha x targets x keep.

    .venv/bin/python benchmarks/optimize_gen_smooth_probe.py > benchmarks/results/optimize-gen-s13-smooth-probe.txt

Deterministic (no clock): it needs no benchmark lock. 1 thread.
"""

from __future__ import annotations

import time
from typing import Any


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from latencylab.optimize.gen_candidates import GenContext, build
    from latencylab.optimize.gen_lab import GenLabConfig, smollm2_subject
    from latencylab.workloads.gen_fidelity import perplexity

    sub = smollm2_subject(GenLabConfig())
    ctx = GenContext(sub.model, sub.inputs, 1)
    held, val = sub.inputs.texts, sub.inputs.validation
    sizes = {n: m.weight.numel() for n, m in sub.model.named_modules() if isinstance(m, torch.nn.Linear)}
    base_h, base_v = perplexity(sub.model, held), perplexity(sub.model, val)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  torch {torch.__version__}")
    print(f"# FP32 perplexity: held-out {base_h:.2f} ({len(held)} lines), validation {base_v:.2f} ({len(val)} lines)")
    print("# per-channel dynamic INT8 (torch quantize_dynamic); ppl delta vs FP32 on the same text")
    print(f"{'smooth':<28} {'keep':<18} {'validation':>10} {'held-out':>9} {'kept share':>10}  kept groups")
    settings: list[dict[str, Any] | None] = [None]
    for alpha in (0.5, 0.8):
        for targets in (["down", "qkv", "gate_up"], ["down", "qkv", "gate_up", "head"]):
            settings.append({"alpha": alpha, "targets": targets})
    for sm in settings:
        keeps = ["none", "kind:down_proj", "screen-validated"] + (["screen"] if sm is None else [])
        for keep in keeps:
            p: dict[str, Any] = {"weights": "dynamic-perchannel"}
            if sm:
                p["smooth"] = sm
            if keep != "none":
                p["keep"] = keep
            r = build(ctx, p)
            dv, dh = perplexity(r.model, val) / base_v - 1, perplexity(r.model, held) / base_h - 1
            scr = r.stats.get("screen") or {}
            kept = set(r.stats.get("keep_float_layers") or ())
            share = sum(w for n, w in sizes.items() if n in kept) / sum(sizes.values())
            label = "-" if not sm else f"a={sm['alpha']} {'+'.join(sm['targets'])}"
            print(f"{label:<28} {keep:<18} {100 * dv:>+9.1f}% {100 * dh:>+8.1f}% {share:>10.2f}  {scr.get('kept', '')}")
            r.close()


if __name__ == "__main__":
    main()

"""Speculative decoding of SmolLM2-135M-Instruct (FP32 target) vs plain greedy decoding, at batch 1.

Equal work: the same prompts (the gen workload's built-in set, chat-templated), the same fixed number of
output tokens (EOS ignored, so every run emits exactly ``--tokens``), the same thread count (1, then 2),
in interleaved rounds (each prompt runs plain and every draft back to back, the order rotated per round).
Per draft: acceptance rate (accepted / proposed drafts), tokens per verify step, draft and verify time per
step, TPOT (decode time from the first token to the last / (tokens - 1), summed over all prompts) and
tokens/s (1 / TPOT), the speed-up over plain decoding's TPOT in the same rounds, and the identity check
(every speculative output token-identical to the plain greedy output of the same prompt).

    /tmp/lbench .venv/bin/python benchmarks/gen_speculative.py --out benchmarks/results/gen-speculative-s1.txt
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("LATENCYLAB_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "latencylab"))


def plain_run(model: Any, ids: list[int], n: int) -> tuple[list[int], int]:
    from latencylab.workloads.gen_decode import DecodeConfig, decode, new_state, prefill

    cfg = DecodeConfig(ignore_eos=True)
    st = decode(model, prefill(model, new_state(ids, n), cfg), cfg, frozenset())
    return st.tokens, st.step_ns[-1] - st.step_ns[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per prompt (EOS ignored)")
    ap.add_argument("--prompts", default="0,2,4,6,8,10,12,14", help="indices into the built-in prompt set")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--drafts", default="lookup@auto,lookup@4,lookup@8,int8@3,exit:20@2", help="draft@k (k: a number or auto)"
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    import torch

    from latencylab.gen.drafts import build_draft
    from latencylab.gen.lm import HFLM
    from latencylab.gen.speculative import AdaptiveK, speculative_generate
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    loaded = load_model()
    tok, model = loaded.tokenizer, loaded.model
    every = builtin_prompts()
    chosen = [int(i) for i in args.prompts.split(",")]
    prompts = [(every[i].label, chat_ids(tok, messages_of(every[i]))) for i in chosen]
    target = HFLM(model)
    specs = [s.split("@") for s in args.drafts.split(",")]
    drafts = {spec: build_draft(spec, model) for spec, _ in specs}
    methods = ["plain"] + [f"{spec}@{k}" for spec, k in specs]
    n = args.tokens
    say(f"# gen_speculative  {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  {platform.processor()}")
    say(f"# torch {torch.__version__}  python {sys.version.split()[0]}  argv {' '.join(sys.argv[1:])}")
    say(f"# {len(prompts)} prompts ({', '.join(lbl for lbl, _ in prompts)}), prompt tokens "
        f"{min(len(p) for _, p in prompts)}-{max(len(p) for _, p in prompts)}, {n} output tokens each, "
        f"{args.rounds} rounds")  # fmt: skip

    def run(method: str, ids: list[int]) -> dict[str, Any]:
        if method == "plain":
            toks, dec = plain_run(model, ids, n)
            return {"tokens": toks, "decode_ns": dec}
        spec, k = method.split("@")
        # auto: the cost model of a verify measured on this CPU (a 5-token forward ~1.7-2x a 1-token one)
        policy: Any = AdaptiveK(k_max=8, verify_base=0.6, verify_slope=0.05) if k == "auto" else int(k)
        r = speculative_generate(target, drafts[spec], ids, n, k=policy)
        return {
            "tokens": list(r.tokens), "decode_ns": r.decode_ns, "proposed": r.proposed, "accepted": r.accepted,
            "steps": len(r.steps), "draft_ns": sum(s.draft_ns for s in r.steps),
            "verify_ns": sum(s.verify_ns for s in r.steps),
        }  # fmt: skip

    summary: dict[str, Any] = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for m in methods:  # warm-up: one short run each
            run(m, prompts[0][1][:64])
        agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        identical: dict[str, bool] = defaultdict(lambda: True)
        t0 = time.perf_counter()
        for rnd in range(args.rounds):
            for pi, (_, ids) in enumerate(prompts):
                shift = (rnd + pi) % len(methods)
                order = methods[shift:] + methods[:shift]
                outs = {m: run(m, ids) for m in order}
                for m, o in outs.items():
                    a = agg[m]
                    for key in ("decode_ns", "proposed", "accepted", "steps", "draft_ns", "verify_ns"):
                        a[key] += o.get(key, 0)
                    a["decode_tokens"] += len(o["tokens"]) - 1
                    identical[m] &= o["tokens"] == outs["plain"]["tokens"]
        wall = time.perf_counter() - t0
        plain_tpot = agg["plain"]["decode_ns"] / agg["plain"]["decode_tokens"] / 1e6
        say()
        say(f"## {threads} thread(s)  ({wall:.0f} s)")
        say(
            f"{'method':<16}{'TPOT ms':>9}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'tok/step':>9}"
            f"{'draft ms/step':>14}{'verify ms/step':>15}{'identical':>10}"
        )
        rows = {}
        for m in methods:
            a = agg[m]
            tpot = a["decode_ns"] / a["decode_tokens"] / 1e6
            row = {"tpot_ms": tpot, "tokens_per_s": 1e3 / tpot, "speedup": plain_tpot / tpot,
                   "identical": identical[m]}  # fmt: skip
            if m != "plain":
                row |= {
                    "acceptance": a["accepted"] / a["proposed"] if a["proposed"] else float("nan"),
                    "tokens_per_step": a["decode_tokens"] / a["steps"],
                    "draft_ms_per_step": a["draft_ns"] / a["steps"] / 1e6,
                    "verify_ms_per_step": a["verify_ns"] / a["steps"] / 1e6,
                }
                say(
                    f"{m:<16}{tpot:9.1f}{1e3 / tpot:8.1f}{plain_tpot / tpot:8.2f}x{row['acceptance']:8.2f}"
                    f"{row['tokens_per_step']:9.2f}{row['draft_ms_per_step']:14.1f}{row['verify_ms_per_step']:15.1f}"
                    f"{'yes' if identical[m] else 'NO':>10}"
                )
            else:
                say(f"{m:<16}{tpot:9.1f}{1e3 / tpot:8.1f}{1.0:8.2f}x{'':8}{1.0:9.2f}{0.0:14.1f}{tpot:15.1f}{'-':>10}")
            rows[m] = row
        best = max((m for m in methods if m != "plain"), key=lambda m: rows[m]["speedup"])
        verdict = "met" if rows[best]["speedup"] >= 2 and rows[best]["identical"] else "not met"
        say(f"best: {best} {rows[best]['speedup']:.2f}x plain TPOT (target >= 2x, identical output): {verdict}")
        summary[str(threads)] = rows
    say()
    say("# json " + json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ONNX Runtime engine inside the continuous-batching server, side by side with the packed torch engine:
``serve --model gen --from DIR`` for an ``ort-*`` choice (genserve/ort_engine.py) vs ``serve --model gen`` (issue 19:
speculative decoding "at batch 1 and inside the continuous-batching server", per draft).

Settings, over the same FP32 SmolLM2, every prompt of the set submitted at once (``max_num_seqs`` = the batch size:
the rest queue and join as others leave), EOS honoured, at most ``--tokens`` tokens, greedy unless ``--temperature``:

* ``packed``: the packed torch engine (``--gen-engine packed``), plain decoding: the baseline;
* ``packed-lookup4``: the same with prompt-lookup drafts (``--spec-lookup 4``);
* ``ort``: the ORT graph (``ort-fp32``), one forward per sequence a step;
* ``ort-int8draft4``: the graph verifying its blockwise-INT8 copy's drafts (``ort-fp32-int8draft-k4``), in steps
  with at most ``--spec-max-batch`` sequences decoding.

Per batch size and round (the order rotated per round): a fresh scheduler and engine (the graphs are exported once).
Printed per setting: the mean of the replies' TPOT (first to last token / (tokens - 1), the scheduler's clock), the
largest reply's TPOT, the pooled TPOT (every reply's first-to-last time summed / their tokens after the first: a
short reply ended by EOS inside a draft-and-verify step weighs by its tokens, not as one reply), output tokens a
second over the run (prefill included), the mean TTFT, the drafts' acceptance,
and whether every answer equals the ``packed`` answer token for token (greedy; sampled runs: not compared).

    /tmp/lbench .venv/bin/python benchmarks/gen_serve_ort.py [--threads 1] [--batches 1,4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def run_once(engine: Any, prompts: list[tuple[int, ...]], eos: frozenset[int], batch: int, tokens: int, k: int,
             most: int, temperature: float) -> dict:  # fmt: skip
    from latencylab.genserve.scheduler import GenRequest, Sampling, Scheduler, SchedulerConfig

    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=batch, spec_lookup_k=k, spec_max_batch=most))
    samp = Sampling(temperature, 1.0, seed=7) if temperature > 0 else Sampling()
    seqs = [sched.submit(GenRequest(p, tokens, samp, eos_ids=eos)) for p in prompts]
    t0 = time.perf_counter()
    while sched.step() is not None:
        pass
    wall = time.perf_counter() - t0
    tpots = sorted((s.token_ns[-1] - s.token_ns[0]) / (len(s.tokens) - 1) / 1e6 for s in seqs if len(s.tokens) > 1)
    span = sum(s.token_ns[-1] - s.token_ns[0] for s in seqs if len(s.tokens) > 1) / 1e6
    pooled = span / sum(len(s.tokens) - 1 for s in seqs if len(s.tokens) > 1)
    ttfts = [(s.first_token_ns - s.arrival_ns) / 1e6 for s in seqs if s.first_token_ns is not None]
    return {
        "answers": [tuple(s.tokens) for s in seqs], "tpot_ms": statistics.mean(tpots), "tpot_max": tpots[-1],
        "tpot_pooled": pooled,
        "tokens_per_s": sum(len(s.tokens) for s in seqs) / wall, "ttft_ms": statistics.mean(ttfts),
        "acceptance": sched.spec_accepted / sched.spec_proposed if sched.spec_proposed else None,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--settings", default="packed,packed-lookup4,ort,ort-int8draft4")
    ap.add_argument("--prompts", default="0,2,4,6,8,10,12,14", help="indices into the built-in prompt set")
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of every request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spec-max-batch", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (answers compared)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from latencylab.gen.ort_decode import OrtLM, build_ort_lm
    from latencylab.gen.ort_llama import quantize_matmuls
    from latencylab.genserve.ort_engine import OrtEngine
    from latencylab.genserve.packed import PackedEngine
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_decode import eos_ids
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    lm = load_model()
    allp = builtin_prompts()
    prompts = [tuple(chat_ids(lm.tokenizer, messages_of(allp[int(i)]))) for i in args.prompts.split(",")]
    eos = frozenset(eos_ids(lm.tokenizer, lm.model))
    settings = args.settings.split(",")
    work = Path(tempfile.mkdtemp(prefix="gen-serve-ort-"))
    target = build_ort_lm(lm.model, work, args.threads)
    quantize_matmuls(target.gen_path, work / "draft.onnx", bits=8, block=32, accuracy_level=4)
    draft = OrtLM(work / "draft.onnx", None, args.threads, target.layers, target.kv_heads, target.head_dim)
    make = {
        "packed": lambda: (PackedEngine(lm.model), 0), "packed-lookup4": lambda: (PackedEngine(lm.model), 4),
        "ort": lambda: (OrtEngine(target, None), 0),
        "ort-int8draft4": lambda: (OrtEngine(target, draft, 4, args.spec_max_batch), 0),
    }  # fmt: skip
    lens = sorted(map(len, prompts))
    print(f"{len(prompts)} prompts ({lens[0]}-{lens[-1]} tokens), max_tokens {args.tokens}, EOS honoured, "
          f"temperature {args.temperature}; {args.threads} thread(s); {args.rounds} rounds, order rotated; drafts in "
          f"steps of <= {args.spec_max_batch} decoding")  # fmt: skip
    print(f"{'batch':>5} {'setting':>15} {'TPOT ms':>8} {'TPOT max':>8} {'pooled':>7} {'tokens/s':>9} {'TTFT ms':>8} "
          f"{'acceptance':>10} {'vs packed':>9} {'pooled vs':>9} {'identical':>9}")  # fmt: skip
    for b in (int(x) for x in args.batches.split(",")):
        runs: dict[str, list[dict]] = {s: [] for s in settings}
        for r in range(args.rounds):
            for s in settings[r % len(settings) :] + settings[: r % len(settings)]:
                engine, k = make[s]()
                runs[s].append(run_once(engine, prompts, eos, b, args.tokens, k, args.spec_max_batch, args.temperature))
        base = statistics.mean(x["tpot_ms"] for x in runs[settings[0]])
        base_pooled = statistics.mean(x["tpot_pooled"] for x in runs[settings[0]])
        ref = runs[settings[0]][0]["answers"]
        for s in settings:
            rs = runs[s]
            tpot = statistics.mean(x["tpot_ms"] for x in rs)
            pooled = statistics.mean(x["tpot_pooled"] for x in rs)
            acc = [x["acceptance"] for x in rs if x["acceptance"] is not None]
            same = "-" if args.temperature > 0 else ("yes" if all(x["answers"] == ref for x in rs) else "NO")
            print(
                f"{b:>5} {s:>15} {tpot:>8.1f} {max(x['tpot_max'] for x in rs):>8.1f} {pooled:>7.1f} "
                f"{statistics.mean(x['tokens_per_s'] for x in rs):>9.2f} "
                f"{statistics.mean(x['ttft_ms'] for x in rs):>8.0f} "
                f"{(f'{statistics.mean(acc):.2f}' if acc else '-'):>10} {base / tpot:>8.2f}x "
                f"{base_pooled / pooled:>8.2f}x {same:>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()

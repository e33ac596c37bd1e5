"""Speculative decoding inside the continuous-batching server: the scheduler over the packed engine with and without
prompt-lookup drafts (``SchedulerConfig.spec_lookup_k``, ``serve --model gen --gen-engine packed --spec-lookup K``),
at decode batches 1, 4 and 8 (issue 19: "at batch 1 and inside the continuous-batching server").

Per batch size and round, for each setting (k = 0, then each ``--ks``, the order rotated per round): a fresh
scheduler and engine over the same FP32 SmolLM2, every prompt of the set submitted at once (``max_num_seqs`` = the
batch size: the rest queue and join as others leave), greedy, each prompt's own EOS honoured and at most
``--tokens`` tokens, stepped until every answer is done. Printed per setting: the mean of the replies' TPOT (first
to last token / (tokens - 1), the scheduler's clock), the output tokens a second over the whole run (prefill
included), the mean decode batch, the drafts' acceptance (kept / drafted), the tokens a decoding sequence got per
step, and whether every answer equals the k = 0 answer token for token (greedy speculation must change nothing).

    /tmp/lbench .venv/bin/python benchmarks/gen_serve_spec.py [--threads 1] [--batches 1,4,8] [--ks 4] [--rounds 2]
        [--spec-max-batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def run_once(
    model: Any, prompts: list[tuple[int, ...]], eos: frozenset[int], batch: int, k: int, tokens: int, most: int
) -> dict:
    from latencylab.genserve.packed import PackedEngine
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig

    cfg = SchedulerConfig(max_num_seqs=batch, spec_lookup_k=k, spec_max_batch=most)
    sched = Scheduler(PackedEngine(model), cfg)
    seqs = [sched.submit(GenRequest(p, tokens, eos_ids=eos)) for p in prompts]
    t0 = time.perf_counter()
    batches, decode_steps, decode_tokens = [], 0, 0
    while (rep := sched.step()) is not None:
        if rep.decode_batch:
            batches.append(rep.decode_batch)
            decode_steps += rep.decode_batch
    wall = time.perf_counter() - t0
    out = sum(len(s.tokens) for s in seqs)
    decode_tokens = sum(len(s.tokens) - 1 for s in seqs)
    tpots = [(s.token_ns[-1] - s.token_ns[0]) / (len(s.tokens) - 1) / 1e6 for s in seqs if len(s.tokens) > 1]
    return {
        "answers": [tuple(s.tokens) for s in seqs], "tpot_ms": statistics.mean(tpots), "tokens_per_s": out / wall,
        "wall_s": wall, "batch": statistics.mean(batches) if batches else 0.0,
        "acceptance": sched.spec_accepted / sched.spec_proposed if sched.spec_proposed else None,
        "per_step": decode_tokens / decode_steps if decode_steps else None, "proposed": sched.spec_proposed,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--ks", default="4", help="drafted tokens a step (each a setting beside k = 0)")
    ap.add_argument("--prompts", default="0,2,4,6,8,10,12,14", help="indices into the built-in prompt set")
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of every request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--spec-max-batch", type=int, default=4,
        help="draft only in steps decoding at most this many sequences (SchedulerConfig.spec_max_batch)",
    )  # fmt: skip
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_decode import eos_ids
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    lm = load_model()
    allp = builtin_prompts()
    prompts = [tuple(chat_ids(lm.tokenizer, messages_of(allp[int(i)]))) for i in args.prompts.split(",")]
    eos = frozenset(eos_ids(lm.tokenizer, lm.model))
    ks = [0, *(int(k) for k in args.ks.split(","))]
    lens = sorted(map(len, prompts))
    print(f"{len(prompts)} prompts ({lens[0]}-{lens[-1]} tokens), max_tokens {args.tokens}, EOS honoured, greedy; "
          f"{args.threads} thread(s); {args.rounds} rounds, order rotated; drafts in steps of <= {args.spec_max_batch} "
          "decoding")  # fmt: skip
    print(f"{'batch':>5} {'k':>3} {'TPOT ms':>8} {'tokens/s':>9} {'mean batch':>10} {'acceptance':>10} "
          f"{'tokens/step':>11} {'vs k=0 TPOT':>11} {'identical':>9}")  # fmt: skip
    for b in (int(x) for x in args.batches.split(",")):
        runs: dict[int, list[dict]] = {k: [] for k in ks}
        for r in range(args.rounds):
            order = ks[r % len(ks) :] + ks[: r % len(ks)]
            for k in order:
                runs[k].append(run_once(lm.model, prompts, eos, b, k, args.tokens, args.spec_max_batch))
        base_tpot = statistics.mean(x["tpot_ms"] for x in runs[0])
        ref = runs[0][0]["answers"]
        for k in ks:
            rs = runs[k]
            tpot = statistics.mean(x["tpot_ms"] for x in rs)
            acc = [x["acceptance"] for x in rs if x["acceptance"] is not None]
            same = all(x["answers"] == ref for x in rs)
            print(
                f"{b:>5} {k:>3} {tpot:>8.1f} {statistics.mean(x['tokens_per_s'] for x in rs):>9.2f} "
                f"{statistics.mean(x['batch'] for x in rs):>10.2f} "
                f"{(f'{statistics.mean(acc):.2f}' if acc else '-'):>10} "
                f"{statistics.mean(x['per_step'] or 0 for x in rs):>11.2f} {base_tpot / tpot:>10.2f}x "
                f"{('yes' if same else 'NO'):>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()

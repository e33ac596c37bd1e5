"""Decode step time of the generative server's engine at batch 1/4/8, what re-packing every step would cost,
and what chunked prefill does to the running sequences' inter-token latency when a long prompt joins.

Why the engine keeps one shared, left-padded cache (re-packed only on join/leave) rather than per-sequence
caches concatenated each step: this prints the step time at each batch size both ways. "shared" is the
engine's decode step as served; "concat/step" forces the re-pack (pad + concatenate every sequence's cache
into the batch) before every step, which is what per-sequence caches would pay.

Chunked prefill: 4 short chats decode (40 tokens each, EOS ignored) while the longest shipped prompt (~500
tokens) joins after 5 steps; printed: the running sequences' ITL p50 / max and the long prompt's TTFT, with a
128-token prefill budget per step and with none (the whole prompt in one step).

    /tmp/lbench .venv/bin/python benchmarks/gen_serve_engine.py [--steps 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,4,8")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    lm = load_model()
    prompts = [chat_ids(lm.tokenizer, messages_of(p)) for p in builtin_prompts()[:8]]
    print(f"prompts: {[len(p) for p in prompts]} tokens; {args.steps} decode steps timed per batch size")
    print(f"{'batch':>5} {'shared ms/step':>15} {'concat/step ms':>15} {'tokens/s (shared)':>18}")
    for b in (int(x) for x in args.batches.split(",")):
        rows = []
        for force in (False, True):
            eng = TorchEngine(lm.model)
            sched = Scheduler(eng, SchedulerConfig(max_num_seqs=b, prefill_chunk_tokens=4096))
            seqs = [sched.submit(GenRequest(tuple(prompts[i % len(prompts)]), args.steps + 4)) for i in range(b)]
            sched.step()  # prefills every prompt (the chunk budget takes them all)
            eng.decode(seqs)  # joins the batch (the one re-pack a batch needs)
            for s, t in zip(seqs, [0] * b, strict=True):
                s.tokens.append(t)
            times = []
            for _ in range(args.steps):
                if force:
                    eng._rows = [*eng._rows, -1]  # the next decode re-packs, as per-sequence caches would each step
                t0 = time.perf_counter()
                out = eng.decode(seqs)
                times.append(time.perf_counter() - t0)
                for s, t in zip(seqs, out, strict=True):
                    s.tokens.append(t)
            rows.append(statistics.median(times))
        print(f"{b:>5} {rows[0] * 1e3:>15.1f} {rows[1] * 1e3:>15.1f} {b / rows[0]:>18.1f}")
    long_prompt = max((chat_ids(lm.tokenizer, messages_of(p)) for p in builtin_prompts()), key=len)
    print(f"\nchunked prefill: 4 decoding + a {len(long_prompt)}-token prompt joining")
    print(f"{'chunk':>6} {'ITL p50 ms':>11} {'ITL max ms':>11} {'long TTFT ms':>13}")
    for chunk in (128, 4096):
        eng = TorchEngine(lm.model)
        sched = Scheduler(eng, SchedulerConfig(max_num_seqs=8, prefill_chunk_tokens=chunk))
        short = [sched.submit(GenRequest(tuple(prompts[i]), 40)) for i in range(4)]
        for _ in range(6):
            sched.step()
        long = sched.submit(GenRequest(tuple(long_prompt), 4))
        while sched.step() is not None:
            pass
        gaps = sorted((b - a) / 1e6 for s in short for a, b in zip(s.token_ns[5:], s.token_ns[6:], strict=False))
        ttft = ((long.first_token_ns or 0) - long.arrival_ns) / 1e6
        print(f"{chunk:>6} {statistics.median(gaps):>11.1f} {gaps[-1]:>11.1f} {ttft:>13.1f}")


if __name__ == "__main__":
    main()

"""Decode step time of the generative server's engine at batch 1/4/8, what re-packing every step would cost,
and what chunked prefill does to the running sequences' inter-token latency when a long prompt joins.

Why the engine keeps one shared, left-padded cache (re-packed only on join/leave) rather than per-sequence
caches concatenated each step: this prints the step time at each batch size both ways. "shared" is the
engine's decode step as served; "concat/step" forces the re-pack (pad + concatenate every sequence's cache
into the batch) before every step, which is what per-sequence caches would pay.

Chunked prefill: 4 short chats decode (80 tokens each, EOS ignored) while the longest shipped prompt (~550
tokens) joins every 16 steps (``--joins`` times); printed: the running sequences' ITL p50 / p99 (nearest rank) /
max and the long prompt's median TTFT, for the prefill policies: none (the whole prompt in one step), a fixed
128-token chunk a step, the budget tied to the TPOT objective (genserve/budget.py), and that budget with a cap on
each step's length (``--itl-caps``, SchedulerConfig.itl_cap_s). With ``--deadlines``, each cap runs again with the
long prompt carrying that TTFT deadline (admission on, learnt costs), once with the cap yielding to the deadline
(``itl_cap_yields=True``: a step passes the cap, within the TPOT plan, while the prompt is behind the first token
admission planned) and once strict (the default); ``shed`` counts the long prompts admission refused.

Engines (``--engines``): ``padded`` (genserve/engine.py, as above: a chunk and the decode batch each their own
forward) and ``packed`` (genserve/packed.py: a step's chunks and decode tokens in one forward, a static K/V buffer
per sequence); the decode table gets the packed engine's step beside the padded one's, and every chunked-prefill
policy runs on each engine, same prompts, same order, interleaved policy by policy.

    /tmp/lbench .venv/bin/python benchmarks/gen_serve_engine.py [--steps 16] [--threads 2] [--batches 1,4,8]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--joins", type=int, default=4, help="chunked prefill: how often the long prompt joins")
    ap.add_argument(
        "--engines", default="padded,packed", help="padded (genserve/engine.py), packed (genserve/packed.py)"
    )
    ap.add_argument(
        "--itl-caps", default="0.25", type=lambda v: [float(x) for x in v.split(",") if x],
        help="chunked prefill: the TPOT-tied budget again with each of these ITL caps, s (SchedulerConfig.itl_cap_s)",
    )  # fmt: skip
    ap.add_argument(
        "--deadlines", default="", type=lambda v: [float(x) for x in v.split(",") if x],
        help="chunked prefill: each cap again with the long prompt's TTFT deadline (s), yielding and strict",
    )  # fmt: skip
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.packed import PackedEngine
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.serve.admission import Shed
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    lm = load_model()
    prompts = [chat_ids(lm.tokenizer, messages_of(p)) for p in builtin_prompts()[:8]]
    print(f"prompts: {[len(p) for p in prompts]} tokens; {args.steps} decode steps timed per batch size")
    engines = [e for e in args.engines.split(",") if e]
    if not set(engines) <= {"padded", "packed"}:
        raise SystemExit(f"--engines {args.engines}: choose from padded, packed")
    make = {"padded": TorchEngine, "packed": PackedEngine}
    print(
        f"{'batch':>5} {'padded ms/step':>15} {'padded concat/step':>19} {'packed ms/step':>15} "
        f"{'tokens/s padded':>16} {'tokens/s packed':>16}"
    )
    for b in (int(x) for x in args.batches.split(",")):
        rows = {}
        for kind in ("padded", "concat", "packed"):
            if ("packed" if kind == "packed" else "padded") not in engines:
                rows[kind] = float("nan")
                continue
            eng = make["packed" if kind == "packed" else "padded"](lm.model)
            sched = Scheduler(eng, SchedulerConfig(max_num_seqs=b, prefill_chunk_tokens=4096))
            seqs = [sched.submit(GenRequest(tuple(prompts[i % len(prompts)]), args.steps + 4)) for i in range(b)]
            sched.step()  # prefills every prompt (the chunk budget takes them all)
            for s in seqs:
                s.tokens = s.tokens[-1:]
            times = []
            for _ in range(args.steps + 1):
                if kind == "concat":
                    eng._rows = [*eng._rows, -1]  # the next decode re-packs, as per-sequence caches would each step
                t0 = time.perf_counter()
                out = eng.decode(seqs)
                times.append(time.perf_counter() - t0)
                for s, t in zip(seqs, out, strict=True):
                    s.tokens.append(t)
            rows[kind] = statistics.median(times[1:])  # the first decode joins the batch (padded: its one re-pack)
        print(
            f"{b:>5} {rows['padded'] * 1e3:>15.1f} {rows['concat'] * 1e3:>19.1f} {rows['packed'] * 1e3:>15.1f} "
            f"{b / rows['padded']:>16.1f} {b / rows['packed']:>16.1f}"
        )
    long_prompt = max((chat_ids(lm.tokenizer, messages_of(p)) for p in builtin_prompts()), key=len)
    joins = args.joins
    print(f"\nchunked prefill: 4 decoding (80 tokens each) while a {len(long_prompt)}-token prompt joins {joins} times")
    print(
        f"{'engine':>6} {'policy':>28} {'ITL p50 ms':>11} {'ITL p99 ms':>11} {'ITL max ms':>11} {'gaps':>5} "
        f"{'long TTFT ms':>13} {'shed':>5}"
    )
    from latencylab.genserve.service import GenServeConfig

    tpot_slo = GenServeConfig().tpot_slo_s
    policies: list[tuple[str, SchedulerConfig, float | None]] = [
        ("whole prompt (none)", SchedulerConfig(max_num_seqs=8, prefill_chunk_tokens=4096), None),
        ("fixed 128 tokens", SchedulerConfig(max_num_seqs=8, prefill_chunk_tokens=128), None),
        (f"TPOT-tied ({tpot_slo * 1e3:g} ms)", SchedulerConfig(max_num_seqs=8, tpot_slo_s=tpot_slo), None),
    ]
    for cap in args.itl_caps:
        policies.append(
            (f"TPOT-tied + ITL cap {cap * 1e3:g}", SchedulerConfig(max_num_seqs=8, tpot_slo_s=tpot_slo, itl_cap_s=cap),
             None)
        )  # fmt: skip
        for d in args.deadlines:
            for yields in (True, False):
                cfg = SchedulerConfig(max_num_seqs=8, tpot_slo_s=tpot_slo, itl_cap_s=cap, itl_cap_yields=yields)
                policies.append((f"cap {cap * 1e3:g} {'yields' if yields else 'strict'}, TTFT {d:g} s", cfg, d))
    for name, cfg, deadline in policies:
        for kind in engines:
            eng = make[kind](lm.model)
            sched = Scheduler(eng, cfg)
            short = [sched.submit(GenRequest(tuple(prompts[i]), 80)) for i in range(4)]
            for _ in range(6):
                sched.step()
            longs, steps, tries = [], 0, 0
            while sched.step() is not None:  # a long prompt joins every 16 steps, `joins` times
                steps += 1
                if steps % 16 == 1 and tries < joins:
                    tries += 1
                    due = None if deadline is None else sched.now_ns() + int(deadline * 1e9)
                    with contextlib.suppress(Shed):  # refused: it cannot meet its deadline on this schedule
                        longs.append(sched.submit(GenRequest(tuple(long_prompt), 4, ttft_deadline_ns=due)))
            gaps = sorted((b - a) / 1e6 for s in short for a, b in zip(s.token_ns[5:], s.token_ns[6:], strict=False))
            ttfts = [((x.first_token_ns or 0) - x.arrival_ns) / 1e6 for x in longs]
            ttft = f"{statistics.median(ttfts):.1f}" if ttfts else "-"
            p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
            print(
                f"{kind:>6} {name:>28} {statistics.median(gaps):>11.1f} {p99:>11.1f} {gaps[-1]:>11.1f} {len(gaps):>5} "
                f"{ttft:>13} {tries - len(longs):>5}"
            )


if __name__ == "__main__":
    main()

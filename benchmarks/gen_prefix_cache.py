"""What the prefix cache saves, and where a lone request's TTFT goes: the server's own stages, one prompt at a time.

For each of the gen workload's 16 built-in prompts, as the benchmark sends them (chat), on SmolLM2 FP32 with 2
threads: tokenization (the chat template + the tokenizer), the prefill through the real engine with the prefix
cache and without it (alternating, ``--reps`` each, medians), and the first token's pick; then the totals and
the ratio. Same engine code as ``latencylab serve --model gen`` (genserve/engine.py), no HTTP.

    /tmp/lbench .venv/bin/python benchmarks/gen_prefix_cache.py      # ~1-2 min
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "gen-prefix-cache.txt"))
    args = ap.parse_args()

    import torch

    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.prefix import chat_prefix
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_model import load_model
    from latencylab.workloads.gen_prompts import builtin_prompts

    torch.set_num_threads(args.threads)
    lm = load_model()
    tok, model = lm.tokenizer, lm.model
    prefix = chat_prefix(lambda m: chat_ids(tok, m))
    cached, plain = TorchEngine(model), TorchEngine(model)
    cached.set_prefix(prefix)

    def prefill_s(engine: TorchEngine, ids: list[int]) -> tuple[float, int]:
        """One request alone through the scheduler's first step (its whole prompt in one forward): seconds, and
        the prompt tokens that ran."""
        sched = Scheduler(engine, SchedulerConfig(tpot_slo_s=0.25))
        seq = sched.submit(GenRequest(tuple(ids), 1))
        rep = sched.step()
        assert rep is not None and seq.tokens
        return rep.prefill_ns / 1e9, rep.prefill_tokens

    warm = chat_ids(tok, [{"role": "user", "content": "warm up"}])
    for e in (cached, plain):
        prefill_s(e, warm)
    lines = [
        f"# benchmarks/gen_prefix_cache.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{args.threads} threads, median of {args.reps}; prefix {len(prefix)} tokens",
        f"{'prompt':<16} {'tokens':>6} {'tokenize ms':>11} {'prefill ms':>10} {'w/ prefix ms':>12} {'saved ms':>8} "
        f"{'ratio':>6}",
    ]
    tot = {"tok": 0.0, "plain": 0.0, "cached": 0.0}
    lengths = []
    for p in builtin_prompts():
        msgs = messages_of(p)
        t = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            ids = chat_ids(tok, msgs)
            t.append(time.perf_counter() - t0)
        tok_s = statistics.median(t)
        a, b = [], []
        for _ in range(args.reps):
            a.append(prefill_s(plain, ids)[0])
            s, ran = prefill_s(cached, ids)
            b.append(s)
        pa, pb = statistics.median(a), statistics.median(b)
        tot["tok"] += tok_s
        tot["plain"] += pa
        tot["cached"] += pb
        lengths.append(len(ids))
        label = (p.label or p.prompt or "")[:16]
        lines.append(f"{label:<16} {len(ids):>6} {tok_s * 1e3:>11.2f} {pa * 1e3:>10.1f} {pb * 1e3:>12.1f} "
                     f"{(pa - pb) * 1e3:>8.1f} {pb / pa:>6.2f}  ({ran} ran)")  # fmt: skip
    n = len(lengths)
    lines.append(
        f"mean over {n} prompts: {statistics.mean(lengths):.0f} tokens (median {statistics.median(lengths):.0f}), "
        f"prefix {len(prefix)} = {len(prefix) / statistics.mean(lengths):.0%} of the mean prompt; tokenize "
        f"{tot['tok'] / n * 1e3:.2f} ms, prefill {tot['plain'] / n * 1e3:.1f} ms -> {tot['cached'] / n * 1e3:.1f} ms "
        f"with the prefix cache (x{tot['cached'] / tot['plain']:.2f}, {(tot['plain'] - tot['cached']) / n * 1e3:.1f} "
        f"ms saved a request)"
    )
    text = "\n".join(lines)
    print(text)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

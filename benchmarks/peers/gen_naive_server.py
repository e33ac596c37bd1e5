"""The naive generative peer: one request at a time through transformers ``generate``, as a user writes it first.

An OpenAI-compatible streaming ``POST /v1/chat/completions`` (benchmarks/peers/gen_peer_common.py) in front of
one generating thread that takes requests first come, first served, and runs each alone:
``model.generate(ids, max_new_tokens=max_tokens, do_sample=False, streamer=...)`` (greedy, KV cache on, FP32),
streaming every new token as it is made. No batching, no admission: the rest wait in the queue.

    python benchmarks/peers/gen_naive_server.py --port 8001 [--threads 1]

Prints ``listening http://HOST:PORT`` when ready. ``GET /stats``: requests served, generate seconds, queue length.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_peer_common import Detok, Job, build_app, load, serve, start_worker


class RowStreamer:
    """A transformers streamer for a batch of jobs: ``put`` gets the prompt once, then one token id per row per
    step; each row's job gets its token (until its EOS or ``max_tokens``)."""

    def __init__(self, jobs: list[Job], tokenizer: Any, eos: set[int]) -> None:
        self.jobs, self.eos = jobs, eos
        self.detok = [Detok(tokenizer) for _ in jobs]
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for job, d, tok in zip(self.jobs, self.detok, value.reshape(-1).tolist(), strict=True):
            if job.done:
                continue
            if tok in self.eos:
                job.finish("stop")
                continue
            job.token(tok, d.add(tok))
            if len(job.out) >= job.max_tokens:
                job.finish("length")

    def end(self) -> None:
        for job in self.jobs:
            job.finish("length")


def generate(model: Any, tokenizer: Any, eos: set[int], jobs: list[Job]) -> None:
    """One ``generate`` call for ``jobs`` (left-padded to the longest prompt), to the largest ``max_tokens``."""
    import torch

    width = max(len(j.ids) for j in jobs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    ids = torch.tensor([[pad] * (width - len(j.ids)) + j.ids for j in jobs])
    mask = torch.tensor([[0] * (width - len(j.ids)) + [1] * len(j.ids) for j in jobs])
    streamer = RowStreamer(jobs, tokenizer, eos)
    with torch.inference_mode():
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max(j.max_tokens for j in jobs), do_sample=False,
            streamer=streamer, pad_token_id=pad, eos_token_id=sorted(eos),
        )  # fmt: skip
    streamer.end()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    tokenizer, model, eos = load(args.threads)
    jobs: queue.Queue[Job] = queue.Queue()
    counters = {"requests": 0, "generate_s": 0.0}

    def worker() -> None:
        while True:
            job = jobs.get()
            t0 = time.perf_counter()
            try:
                generate(model, tokenizer, eos, [job])
            except Exception as exc:
                print(f"generate failed: {exc!r}", file=sys.stderr, flush=True)
                job.finish("error")
            counters["requests"] += 1
            counters["generate_s"] += time.perf_counter() - t0

    start_worker(worker)
    stats = lambda: {**counters, "queued": jobs.qsize()}  # noqa: E731
    serve(build_app(tokenizer, jobs.put, "smollm2", stats), args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The static-batching generative peer: requests grouped by a timeout, each batch generated to its longest.

The same streaming ``POST /v1/chat/completions`` as the naive peer (benchmarks/peers/gen_peer_common.py); one
generating thread takes the first waiting request, waits up to ``--batch-timeout-ms`` from that request's
arrival for more (at most ``--max-batch`` in all; whatever queued during the previous batch goes at once), then
runs one ``model.generate`` over the batch (left-padded to its longest prompt, ``max_new_tokens`` = the batch's
largest ``max_tokens``, greedy, FP32). Every row streams its tokens as they are made and ends at its own EOS or
``max_tokens``; the batch holds the model until its longest row is done, and a request arriving meanwhile waits
for the next batch (the difference from continuous batching).

    python benchmarks/peers/gen_static_server.py --port 8002 [--threads 1] [--max-batch 8] [--batch-timeout-ms 250]

Prints ``listening http://HOST:PORT`` when ready. ``GET /stats``: batches, requests, mean batch size, queue length.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_naive_server import generate
from gen_peer_common import Job, build_app, load, serve, start_worker


def next_batch(jobs: queue.Queue[Job], max_batch: int, timeout_s: float) -> list[Job]:
    """The first waiting job and what joins it within ``timeout_s`` of its arrival (at most ``max_batch``)."""
    batch = [jobs.get()]
    deadline = batch[0].arrived + timeout_s
    while len(batch) < max_batch:
        left = deadline - time.monotonic()
        try:
            batch.append(jobs.get(timeout=left) if left > 0 else jobs.get_nowait())
        except queue.Empty:
            break
    return batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--batch-timeout-ms", type=float, default=250.0)
    args = ap.parse_args()
    tokenizer, model, eos = load(args.threads)
    jobs: queue.Queue[Job] = queue.Queue()
    counters = {"batches": 0, "requests": 0, "generate_s": 0.0}

    def worker() -> None:
        while True:
            batch = next_batch(jobs, args.max_batch, args.batch_timeout_ms / 1e3)
            t0 = time.perf_counter()
            try:
                generate(model, tokenizer, eos, batch)
            except Exception as exc:
                print(f"generate failed: {exc!r}", file=sys.stderr, flush=True)
                for job in batch:
                    job.finish("error")
            counters["batches"] += 1
            counters["requests"] += len(batch)
            counters["generate_s"] += time.perf_counter() - t0

    def stats() -> dict[str, float]:
        b = counters["batches"]
        return {**counters, "mean_batch": counters["requests"] / b if b else 0.0, "queued": jobs.qsize()}

    start_worker(worker)
    serve(build_app(tokenizer, jobs.put, "smollm2", stats), args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

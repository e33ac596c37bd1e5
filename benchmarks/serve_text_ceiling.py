"""How much can scheduling alone buy on the text benchmark? Ideal capacities of six serving policies.

serve_vs_peers.py compares servers that all run the same ONNX file on the same 2 cores, where batching buys
little (MiniLM's cost on ORT is nearly linear in tokens). What separates them is the order and the
parallelism in which they run requests. This script measures, on this machine, what one forward costs
alone (the fused FP32 export latencylab serves, batch 1, 1 and 2 ORT threads, spinning workers, lengths
8-256, median of 15 calls) and then simulates Poisson arrivals of the shipped corpus's real token
lengths through six policies, with those service times and nothing else (no HTTP, no tokeniser, no
generator, no interference):

* FIFO 1x2t: one queue, one forward at a time on 2 threads (latencylab with a long deadline, batches of 1);
* SJF 1x2t: the shortest waiting request next, non-preemptive (latencylab's default shortest-bucket-first
  order: ``order_by = "deadline"`` with the 30-s default deadline);
* SJF+SLO 1x2t: the same, unless a waiting request would miss arrive + SLO behind the shortest and can still
  make it by going now (latencylab's opt-in ``order_by = "slo"``);
* FIFO 2x1t: two forwards at once on 1 thread each;
* SJF+SLO 2x1t: that order over two 1-thread compute workers (``compute_workers = 2``, ``ort_threads = 1``);
* PS 2t: processor sharing of one 2-thread engine among all requests in flight (the naive server: every
  request its own thread, concurrent ORT calls sharing the pool).

For each policy: the highest rate whose p99 (+ 0.6 ms per request outside the forward) stays <= the SLO,
bisected to 1 req/s over 3 x 30000 requests. The ratio between policies is the most a scheduler can gain
over the naive server on this workload, before any real-world cost.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/serve_text_ceiling.py [--slo-ms 100]
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

LENGTHS = (8, 16, 32, 64, 96, 128, 192, 256)
OUTSIDE_MS = 0.6  # per request, outside the forward: added to each latency, not to the engine's work


def measure_costs(reps: int = 15) -> dict[int, np.ndarray]:
    """Median ms of one batch-1 forward per length in LENGTHS, for 1 and 2 ORT threads."""
    import onnxruntime as ort

    from latencylab.serve.ort_text import _packaged_shape, export_default, fused_onnx, text_onnx_path

    path = text_onnx_path()
    if not path.is_file():
        export_default(path)
    fused = fused_onnx(path, *_packaged_shape())
    out = {}
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        sess = ort.InferenceSession(str(fused), so, providers=["CPUExecutionProvider"])
        ms = []
        for n in LENGTHS:
            feed = {"input_ids": np.full((1, n), 1000, np.int64), "attention_mask": np.ones((1, n), np.int64)}
            for _ in range(3):
                sess.run(None, feed)
            runs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                sess.run(None, feed)
                runs.append(time.perf_counter() - t0)
            ms.append(1e3 * float(np.median(runs)))
        out[threads] = np.array(ms)
    return out


def corpus_lengths() -> np.ndarray:
    from latencylab.workloads.text import corpus, load_model

    tok, _ = load_model(attn="eager")
    return np.array([len(tok(t)["input_ids"]) for t in corpus()])


def fifo(arrive: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    free = np.zeros(servers)
    done = np.empty_like(arrive)
    for i in range(arrive.size):
        k = int(np.argmin(free))
        free[k] = max(free[k], arrive[i]) + service[i]
        done[i] = free[k]
    return done - arrive


def sjf(arrive: np.ndarray, service: np.ndarray) -> np.ndarray:
    done = np.empty_like(arrive)
    waiting: list[tuple[float, int]] = []
    i, now, n = 0, 0.0, arrive.size
    while i < n or waiting:
        if not waiting and arrive[i] > now:
            now = arrive[i]
        while i < n and arrive[i] <= now:
            heapq.heappush(waiting, (service[i], i))
            i += 1
        s, j = heapq.heappop(waiting)
        now += s
        done[j] = now
    return done - arrive


def sjf_slo(arrive: np.ndarray, service: np.ndarray, slo_ms: float, servers: int = 1) -> np.ndarray:
    """Shortest first, unless a waiting request would miss arrive + SLO behind the shortest while it can still
    make it if it goes now (then the least laxity goes): latencylab's Batcher._pick with order_by = "slo",
    on ``servers`` engines (compute workers) taking the next request as each frees."""
    done = np.empty_like(arrive)
    free = [0.0] * servers
    waiting: list[int] = []
    i, n = 0, arrive.size
    budget = slo_ms - OUTSIDE_MS
    while i < n or waiting:
        k = min(range(servers), key=free.__getitem__)
        now = free[k]
        if not waiting and arrive[i] > now:
            now = arrive[i]
        while i < n and arrive[i] <= now:
            waiting.append(i)
            i += 1
        first = min(waiting, key=lambda j: service[j])
        at_risk = [j for j in waiting if j != first and 0 <= arrive[j] + budget - now - service[j] < service[first]]
        j = min(at_risk, key=lambda j: arrive[j] + budget - now - service[j]) if at_risk else first
        waiting.remove(j)
        free[k] = now + service[j]
        done[j] = free[k]
    return done - arrive


def processor_sharing(arrive: np.ndarray, service: np.ndarray) -> np.ndarray:
    done = np.empty_like(arrive)
    left: dict[int, float] = {}
    i, now, n = 0, 0.0, arrive.size
    while i < n or left:
        nxt = arrive[i] if i < n else np.inf
        first = min(left, key=left.__getitem__) if left else -1
        finish = now + left[first] * len(left) if left else np.inf
        t = min(nxt, finish)
        share = (t - now) / len(left) if left else 0.0
        for j in left:
            left[j] -= share
        now = t
        if nxt <= finish:
            left[i] = float(service[i])
            i += 1
        else:
            done[first] = now
            del left[first]
    return done - arrive


def capacity(policy: Callable[[np.ndarray, np.ndarray], np.ndarray], lengths: np.ndarray, cost: Any,
             slo_ms: float, n: int = 30000, seeds: int = 3) -> float:  # fmt: skip
    def p99(rate: float) -> float:
        vals = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            arrive = np.cumsum(rng.exponential(1e3 / rate, n))
            service = cost(lengths[rng.integers(0, lengths.size, n)])
            vals.append(float(np.quantile(policy(arrive, service) + OUTSIDE_MS, 0.99)))
        return float(np.mean(vals))

    lo, hi = 1.0, 400.0
    while hi - lo > 1.0:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p99(mid) <= slo_ms else (lo, mid)
    return lo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slo-ms", type=float, default=100.0)
    args = ap.parse_args(argv)
    costs = measure_costs()
    lengths = corpus_lengths()
    print(f"corpus: {lengths.size} texts, tokens p50 {np.median(lengths):.0f}, p99 {np.quantile(lengths, 0.99):.0f}")
    print("one forward alone, ms (fused FP32 export, batch 1, spinning ORT workers):")
    print("  tokens   " + " ".join(f"{n:>6}" for n in LENGTHS))
    for t in (1, 2):
        print(f"  {t} thread{'s' if t > 1 else ' '} " + " ".join(f"{v:6.1f}" for v in costs[t]))

    def cost(threads: int) -> Callable[[np.ndarray], np.ndarray]:
        return lambda n: np.interp(n, LENGTHS, costs[threads])

    print(f"  corpus mean: {cost(1)(lengths).mean():.1f} ms on 1 thread, {cost(2)(lengths).mean():.1f} ms on 2")
    policies: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
        "FIFO 1x2t": lambda a, s: fifo(a, s, 1),
        "SJF 1x2t": sjf,
        "SJF+SLO 1x2t": lambda a, s: sjf_slo(a, s, args.slo_ms),
        "FIFO 2x1t": lambda a, s: fifo(a, s, 2),
        "SJF+SLO 2x1t": lambda a, s: sjf_slo(a, s, args.slo_ms, servers=2),
        "PS 2t (naive)": processor_sharing,
    }
    threads = {"FIFO 1x2t": 2, "SJF 1x2t": 2, "SJF+SLO 1x2t": 2, "FIFO 2x1t": 1, "SJF+SLO 2x1t": 1, "PS 2t (naive)": 2}
    caps = {name: capacity(p, lengths, cost(threads[name]), args.slo_ms) for name, p in policies.items()}
    ps = caps["PS 2t (naive)"]
    print(f"\nideal capacity at p99 <= {args.slo_ms:g} ms (service times alone, Poisson, 3 x 30000 requests):")
    for name, c in caps.items():
        print(f"  {name:<14} {c:6.0f}/s   {c / ps:.2f}x processor sharing")
    return 0


if __name__ == "__main__":
    sys.exit(main())

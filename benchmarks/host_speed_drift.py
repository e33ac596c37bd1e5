"""How fast is this host, minute to minute, when nothing of ours runs? Fixed kernels timed every few seconds.

Issue 22 asks for a capacity search whose answer, repeated on the same machine and code, moves by no more than
+/-10%. A CPU-bound server's capacity in req/s moves with the host's speed, whatever the search does; this script
measures that speed with nothing else running (take the benchmark lock), with three fixed kernels per reading:

* ``cpu``: the machine-speed canary's pure-Python loop (``latencylab.canary``; median and first quartile of its
  25 repeats, ms): the interpreter's speed, what a request's Python glue runs at;
* ``matmul``: one thread, ``relu(x @ w) @ w.T`` with x 128 x 384 and w 384 x 1536 (the text model's MLP shape at
  128 tokens; median and minimum of 30 repeats, ms): the model's arithmetic;
* ``mem``: the canary's memory kernel (best of 2 copies of 64 MiB, GB/s).

Then ``--interval-s`` of sleep. Prints one JSON line a reading and a summary: per kernel the min, median, max
and the spread (max |x - median| / median), the figure issue 22's +/-10% is judged by.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/host_speed_drift.py --duration-s 600
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

KERNELS = ("cpu_med_ms", "cpu_q1_ms", "matmul_med_ms", "matmul_min_ms", "mem_gbps")


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return max(abs(v - med) for v in values) / med


def reading(canary: object, a: object, w: object) -> dict[str, float]:
    cr = canary.read("between")  # type: ignore[attr-defined]
    cpu = sorted(cr.cpu_ns)
    ts = []
    for _ in range(30):
        t = time.perf_counter_ns()
        (a @ w).relu_() @ w.T  # type: ignore[operator]
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    return {
        "t_s": round(cr.t_s, 1),
        "cpu_med_ms": statistics.median(cpu) / 1e6,
        "cpu_q1_ms": cpu[len(cpu) // 4] / 1e6,
        "matmul_med_ms": statistics.median(ts) / 1e6,
        "matmul_min_ms": ts[0] / 1e6,
        "mem_gbps": max(cr.mem_gbps),
        "steal_ticks": cr.steal_ticks or 0,
        "total_ticks": cr.total_ticks or 0,
    }


def main() -> None:
    import torch

    from latencylab.canary import MachineCanary

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    canary = MachineCanary(mem_repeats=2)
    a, w = torch.randn(128, 384), torch.randn(384, 1536)
    rows = []
    end = time.monotonic() + args.duration_s
    while time.monotonic() < end:
        rows.append(reading(canary, a, w))
        print(json.dumps({k: round(v, 4) for k, v in rows[-1].items()}), flush=True)
        time.sleep(args.interval_s)
    if len(rows) < 2:
        raise SystemExit("fewer than two readings: give a longer --duration-s")
    ticks = max(1, rows[-1]["total_ticks"] - rows[0]["total_ticks"])
    steal = (rows[-1]["steal_ticks"] - rows[0]["steal_ticks"]) / ticks
    print(f"{len(rows)} readings over {rows[-1]['t_s']:.0f} s, steal {steal:.2%} of the CPU time")
    print(f"{'kernel':<15} {'min':>8} {'median':>8} {'max':>8} {'spread':>8}")
    for k in KERNELS:
        v = [r[k] for r in rows]
        pct = f"+/-{100 * spread(v):.1f}%"
        print(f"{k:<15} {min(v):>8.3f} {statistics.median(v):>8.3f} {max(v):>8.3f} {pct:>8}")


if __name__ == "__main__":
    main()

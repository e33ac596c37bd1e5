"""How late the open-loop generator sends, per spin mode, side by side (interleaved rounds, one server).

The reference OIP server (``--service constant(10ms) --serial``: an M/D/1 queue) takes Poisson load at
``--rate`` for ``--seconds`` per run, ``--rounds`` times each of ``off`` (a helper thread sleeps to the
intended time), ``auto`` (on 2 cores beside a server: sleeps to the time minus the learned wake margin, then
yields the rest) and ``on`` (sleeps to 1.5 ms before, then busy-waits). Prints, per mode, the share of sends
more than 1 ms late (the validity rule's measure: a run is invalid over 1%), the runs over that limit, the
lateness p50/p99 and the generator's CPU.

    .venv/bin/python benchmarks/send_timing.py [--rate 70 --seconds 2.5 --rounds 10]
"""

from __future__ import annotations

import argparse

import numpy as np

from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.runner import load_test
from load_truth import server

MODES = ("off", "auto", "on")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=70.0)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    late: dict[str, list[float]] = {m: [] for m in MODES}
    lat: dict[str, list[np.ndarray]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    with server("--service", "constant(10ms)", "--serial") as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"), n=16)
        for k in range(args.rounds):
            for mode in MODES:  # interleaved: each round runs every mode once, with the same arrivals
                cfg = LoadConfig(duration_s=args.seconds, connections=16, spin=mode, timeout_s=10.0)
                res, rec = load_test(url, infer_path("reference"), payloads, Poisson(args.rate, k), cfg, env={})
                late[mode].append(float(res.summary["late_fraction"]))
                lat[mode].append(rec.lateness() / 1e6)
                cpu[mode].append(float(res.summary["client_cpu_share"]))
    print(f"{args.rounds} rounds x {args.seconds} s at {args.rate:g} req/s Poisson, M/D/1 server (10 ms)")
    print("| spin | sends > 1 ms late (mean) | runs over 1% | lateness p50 | lateness p99 | generator CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        allv = np.concatenate(lat[mode])
        over = sum(f > 0.01 for f in late[mode])
        p50, p99 = np.percentile(allv, [50, 99])
        print(f"| {mode} | {100 * np.mean(late[mode]):.2f}% | {over} of {args.rounds} | {p50:.3f} ms | {p99:.2f} ms | "
              f"{np.mean(cpu[mode]):.3f} cores |")  # fmt: skip


if __name__ == "__main__":
    main()

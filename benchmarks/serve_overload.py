"""Overload: latencylab's server at 2x its capacity vs a naive server, both open loop, same arrivals.

The claim (issue): offered load at 2x latencylab's capacity for 60 s: the P99 of admitted requests stays
<= SLO, goodput >= 90% of capacity, and ``sent == ok + shed + error`` exactly, while the naive server's
P99 grows without bound.

Method

1. ``latencylab serve`` with a one-rung ladder (``["fp32"]``: the guard has nowhere to go, so this
   measures admission control and batching, not the fallback ladder), ``default_deadline_ms = SLO``
   (the server's own policy: a request it cannot answer within the SLO is refused at admission with
   503 + Retry-After rather than queued), torch at 1 thread, pinned to CPU 1. The generator stamps every
   request with ``X-Request-Start`` = its intended send time (``--no-request-start``: off), and the server
   counts the deadline from then: time before its handler runs (the generator's lateness, the socket
   queue, event-loop lag) is otherwise invisible to it but counted by the client's corrected latency.
   The naive server ignores the header.
2. Its capacity: ``find_capacity`` (Poisson steps of ``--step-duration`` s, bracket then bisect to 5%;
   a step passes when corrected p99 <= SLO and <= 1% of requests were shed or failed). The capacity is
   the best goodput (ok within the SLO per second) among passing steps.
3. Overload: Poisson arrivals at ``--factor`` (2) x the capacity rate for ``--duration`` s, from this
   process (the generator) pinned to CPU 0. Reported: sent / ok / shed / error (the identity is
   asserted), p99 of ok requests from the intended send time (coordinated-omission corrected), goodput,
   shed reasons and error kinds from the server's /metrics, and p99 per 10-s window.
4. The same arrivals (same seed) against benchmarks/serve_naive.py: same variant object, same OIP codec,
   one forward per request, unbounded FIFO, no admission control; its per-request timeout is
   ``--duration`` s (beyond that a request counts as an error), so the run stays bounded. With
   ``--naive-capacity`` the naive server's own capacity is searched too (same rule) and it is also run at
   ``--factor`` x that, because 2x latencylab's capacity need not overload it. Each naive run gets a fresh
   process (requests the client abandoned stay queued in the old one).
5. Server CPU per successful request (from /proc, all threads) for every run: what each request costs.

Why the SLO: a vision request costs the server ~3 ms of CPU (HTTP + JSON + base64 + JPEG decode + resize
+ a 0.6-ms forward), so a 100 ms SLO is ~30x the work and hardly constrains anything; 30 ms (~10x) makes
queueing, which admission control exists to govern, the dominant term of the tail, while leaving room
for the 4 ms batching delay and loopback noise. Text at 1 thread is a poor fit for this claim on these
CPUs: the corpus's 256-token passages take ~100 ms alone, so with a 100 ms SLO the "capacity" is set by
service time (measured 8.8/s) far below the throughput ceiling, and 2x of it is no overload at all.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/serve_overload.py [--model vision|text]
        [--slo-ms 30] [--duration 60 | --quick] [--json /tmp/overload.json]

Exit status 0 when every claim holds, 1 when one fails (the tables say which).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import (
    PY,
    ROOT,
    by_label,
    delta,
    fmt,
    free_port,
    machine_load,
    proc_cpu_s,
    server_process,
    table,
    windows,
    write_serve_config,
)
from latencylab.load.arrivals import Poisson
from latencylab.load.capacity import Capacity, find_capacity, step_seed
from latencylab.load.generator import LoadConfig, Payload, Records
from latencylab.load.payloads import infer_path, text_payloads, vision_payloads
from latencylab.load.reconcile import scrape
from latencylab.load.results import LoadResult, Slo
from latencylab.load.runner import load_test

SERVER_CPU = 1
CLIENT_CPU = 0
WINDOW_S = 10.0


def payloads_for(model: str) -> list[Payload]:
    return vision_payloads() if model == "vision" else text_payloads()


def run_once(
    url: str, path: str, payloads: list[Payload], rate: float, duration_s: float, timeout_s: float,
    slo: Slo, seed: int, env: dict[str, Any], abort_when: Any = None, request_start: bool = True,
) -> tuple[LoadResult, Records]:  # fmt: skip
    cfg = LoadConfig(duration_s=duration_s, timeout_s=timeout_s, connections=32, request_start_header=request_start)
    return load_test(url, path, payloads, Poisson(rate, seed), cfg, slo, seed=seed, abort_when=abort_when, env=env)


def capacity_search(url: str, path: str, payloads: list[Payload], slo: Slo, args: argparse.Namespace) -> Capacity:
    env: dict[str, Any] = {"note": "serve_overload capacity step"}

    def step(rate: float, abort_when: Any) -> LoadResult:
        # A step the generator itself invalidated (> 1% of sends > 1 ms late: on a shared 2-vCPU VM, a host
        # hiccup) says nothing about the server; counted as a failure it would cap the capacity below the
        # server's. Retry it, twice at most, and say so.
        for attempt in range(3):
            res, _ = run_once(
                url,
                path,
                payloads,
                rate,
                args.step_duration,
                10.0,
                slo,
                step_seed(args.seed, rate),
                env,
                abort_when,
                args.request_start,
            )
            time.sleep(1.0)  # let the server drain before the next step
            reasons = res.summary.get("invalid_reasons", [])
            if res.summary.get("valid", False) or not any("generator fell behind" in r for r in reasons):
                break
            print(f"  offered {rate:7.1f}/s  generator fell behind (attempt {attempt + 1}): retrying the step")
        return res

    def on_step(s: dict[str, Any]) -> None:
        print(
            f"  offered {s['offered_rate']:7.1f}/s  goodput {fmt(s['goodput'])}/s  p99 {fmt(s['p99_ms'], '.2f')} ms"
            f"  sent {s['sent']}  {'pass' if s['passed'] else 'FAIL'}: {s['why']}",
            flush=True,
        )

    return find_capacity(step, slo, start_rate=args.start_rate, precision=0.05, on_step=on_step)


def summarise(label: str, res: LoadResult, rec: Records, slo_ms: float, duration_s: float) -> dict[str, Any]:
    s = res.summary
    ok = rec.outcome == 0
    lat_ms = (rec.done_ns - rec.intended_ns) / 1e6
    good = int((ok & (lat_ms <= slo_ms)).sum())
    return {
        "server": label,
        "offered_rate": s["target_rate"],
        "achieved_rate": s["achieved_rate"],
        "sent": s["sent"],
        "ok": s["ok"],
        "shed": s["shed"],
        "error": s["error"],
        "identity": s["sent"] == s["ok"] + s["shed"] + s["error"],
        "p50_ms": s.get("p50_ms"),
        "p99_ms": s.get("p99_ms"),
        "p99_ci_ms": s.get("p99_ci_ms"),
        "max_ms": s.get("max_ms"),
        "uncorrected_p99_ms": s.get("uncorrected_p99_ms"),
        # per second from the first intended send to the last completion, as find_capacity's goodput
        "wall_s": s["duration_s"],
        "goodput": good / s["duration_s"] if s["duration_s"] else 0.0,
        "throughput_ok": s["throughput_ok"] or 0.0,
        "valid": s["valid"],
        "invalid_reasons": s["invalid_reasons"],
        "late_fraction": s["late_fraction"],
        "lateness_p99_ms": s["lateness_p99_ms"],
        "max_in_flight": s["max_in_flight"],
        "connections_opened": s["connections_opened"],
        "client_cpu_percent": s["client_cpu_percent"],
        "errors_by_reason": s["errors_by_reason"],
        "windows": windows(rec.intended_ns, rec.done_ns, rec.outcome, WINDOW_S, slo_ms, duration_s),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["vision", "text"], default="vision")
    ap.add_argument("--slo-ms", type=float, help="p99 objective (default: vision 30, text 100)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of overload per server (default 60)")
    ap.add_argument("--quick", action="store_true", help="15-s overload runs and 5-s capacity steps")
    ap.add_argument("--step-duration", type=float, default=10.0, help="seconds per capacity step")
    ap.add_argument("--start-rate", type=float, help="first capacity step (default: vision 100/s, text 10/s)")
    ap.add_argument("--capacity", type=float, help="skip the search: use this capacity (req/s)")
    ap.add_argument("--factor", type=float, default=2.0, help="overload = factor x capacity")
    ap.add_argument("--deadline-ms", type=float, help="server's default_deadline_ms (default: the SLO)")
    ap.add_argument(
        "--request-start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send X-Request-Start (intended send time); the server counts deadlines from it (default on)",
    )
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of both servers")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the server and the generator to CPUs")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--naive-capacity", action="store_true", help="also search the naive server's capacity")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID prints every thread's stack (a stuck run)
    if args.quick:
        args.duration = 15.0
        args.step_duration = 5.0
    slo_ms = args.slo_ms or (30.0 if args.model == "vision" else 100.0)
    args.start_rate = args.start_rate or (100.0 if args.model == "vision" else 10.0)
    slo = Slo(0.99, slo_ms * 1e6)
    pin = None if args.no_pin or (os.cpu_count() or 1) < 2 else {SERVER_CPU}
    if pin:
        os.sched_setaffinity(0, {CLIENT_CPU})
    origin = "X-Request-Start (intended send)" if args.request_start else "handler start"
    print(f"serve_overload: model {args.model}, SLO p99 <= {slo_ms:g} ms, server deadline "
          f"{args.deadline_ms or slo_ms:g} ms from {origin}, {machine_load()}")  # fmt: skip
    payloads = payloads_for(args.model)
    path = infer_path(args.model)
    out: dict[str, Any] = {"model": args.model, "slo_ms": slo_ms, "args": vars(args), "load_before": os.getloadavg()}
    t_start = time.perf_counter()
    ok_all = True

    with tempfile.TemporaryDirectory(prefix="serve-overload-") as tmp:
        cfg = write_serve_config(
            Path(tmp) / "serve.toml",
            {
                "name": args.model,
                "ladder": ["fp32"],
                "slo_ms": slo_ms,
                "default_deadline_ms": args.deadline_ms or slo_ms,
                "max_batch_size": args.max_batch_size,
            },
        )
        argv = [PY, "-m", "latencylab", "serve", "--config", str(cfg), "--port", str(free_port())]
        argv += ["--threads", str(args.threads)]
        log = Path(tmp) / "latencylab-serve.log"
        with server_process(argv, log, pin) as srv:
            url = srv.url
            if args.capacity:
                cap_rate, cap_goodput = args.capacity, args.capacity
                out["capacity"] = {"given": args.capacity}
            else:
                print(f"capacity search on {url}{path} (steps of {args.step_duration:g} s):", flush=True)
                t0 = time.perf_counter()
                cap = capacity_search(url, path, payloads, slo, args)
                out["capacity"] = {**cap.to_dict(), "search_s": time.perf_counter() - t0}
                print(f"capacity: {cap.capacity_rate}/s offered, goodput {fmt(cap.goodput)}/s ({cap.reason})")
                if cap.capacity_rate is None or cap.goodput is None:
                    print("no capacity found: nothing to overload")
                    return 1
                cap_rate, cap_goodput = cap.capacity_rate, cap.goodput
            rate = args.factor * cap_rate

            def measure(label: str, r: float, duration_s: float) -> dict[str, Any]:
                time.sleep(2.0)
                before = scrape(url) or {}
                cpu0 = proc_cpu_s(srv.proc.pid)
                res, rec = run_once(
                    url, path, payloads, r, duration_s, 30.0, slo, args.seed, {}, None, args.request_start
                )
                cpu1 = proc_cpu_s(srv.proc.pid)
                time.sleep(0.5)
                d = delta(scrape(url) or {}, before)
                m = summarise(label, res, rec, slo_ms, duration_s)
                m["server_cpu_ms_per_ok"] = 1e3 * (cpu1 - cpu0) / max(1, m["ok"])
                m["server_shed_by_reason"] = by_label(d, "latencylab_server_shed_total", "reason")
                m["server_errors_by_kind"] = by_label(d, "latencylab_server_errors_total", "kind")
                m["server_requests_by_code"] = by_label(d, "latencylab_server_requests_total", "code")
                m["server_batches_by_reason"] = by_label(d, "latencylab_server_batches_total", "reason")
                bs_sum = sum(v for (n, _), v in d.items() if n == "latencylab_server_batch_size_sum")
                bs_n = sum(v for (n, _), v in d.items() if n == "latencylab_server_batch_size_count")
                m["server_mean_batch_size"] = bs_sum / bs_n if bs_n else None
                age = "latencylab_server_request_age_at_handler_seconds"
                age_n = sum(v for (n, _), v in d.items() if n == f"{age}_count")
                age_s = sum(v for (n, _), v in d.items() if n == f"{age}_sum")
                m["server_request_age_mean_ms"] = 1e3 * age_s / age_n if age_n else None
                m["server_stages_mean_ms"] = dict(res.server["server_stages_mean_ms"]) if res.server else None
                m["client_uncorrected_mean_ms"] = res.server["client_mean_ms"] if res.server else None
                m["network_and_client_mean_ms"] = res.server["network_and_client_mean_ms"] if res.server else None
                return m

            # A short run at the capacity first: the stage times of a server that keeps up, to compare with.
            base_s = min(args.duration, 20.0)
            print(f"at capacity: Poisson {cap_rate:.1f}/s for {base_s:g} s")
            at_cap = measure("latencylab @ capacity", cap_rate, base_s)
            out["latencylab_at_capacity"] = at_cap
            print(f"overload: Poisson {rate:.1f}/s ({args.factor:g} x {cap_rate:.1f}) for {args.duration:g} s")
            ll = measure("latencylab", rate, args.duration)
            out["latencylab"] = ll
        out["latencylab_log_tail"] = log.read_text(encoding="utf-8", errors="replace")[-3000:]

        naives: list[dict[str, Any]] = []
        if not args.skip_naive:
            argv = [PY, str(ROOT / "benchmarks" / "serve_naive.py"), "--model", args.model, "--port", "0"]
            argv += ["--threads", str(args.threads)]
            log = Path(tmp) / "naive.log"
            rates = [("naive", rate)]
            if args.naive_capacity:
                with server_process(argv, log, pin) as srv:
                    print(f"naive capacity search on {srv.url}{path}:")
                    ncap = capacity_search(srv.url, path, payloads, slo, args)
                out["naive_capacity"] = ncap.to_dict()
                print(f"naive capacity: {ncap.capacity_rate}/s offered, goodput {fmt(ncap.goodput)}/s")
                if ncap.capacity_rate is not None:
                    rates.append((f"naive @ {args.factor:g}x its own capacity", args.factor * ncap.capacity_rate))
            for label, r in rates:
                # A fresh process per run: requests the client gave up on stay queued in the old one.
                with server_process(argv, log, pin) as srv:
                    print(f"{label}: Poisson {r:.1f}/s for {args.duration:g} s (request timeout {args.duration:g} s)")
                    time.sleep(1.0)
                    cpu0 = proc_cpu_s(srv.proc.pid)
                    res, rec = run_once(
                        srv.url, path, payloads, r, args.duration, args.duration, slo, args.seed, {}, None,
                        args.request_start,
                    )  # fmt: skip
                    nv = summarise(label, res, rec, slo_ms, args.duration)
                    nv["server_cpu_ms_per_ok"] = 1e3 * (proc_cpu_s(srv.proc.pid) - cpu0) / max(1, nv["ok"])
                    naives.append(nv)
            out["naive"] = naives
            out["naive_log_tail"] = log.read_text(encoding="utf-8", errors="replace")[-3000:]

    # ------------------------------------------------------------------------------------------ report
    runs = [ll, *naives]
    rows = []
    for r in [at_cap, *runs]:
        rows.append(
            [
                r["server"], f"{r['offered_rate']:.1f}", r["sent"], r["ok"], r["shed"], r["error"],
                "yes" if r["identity"] else "NO", fmt(r["p50_ms"], ".2f"), fmt(r["p99_ms"], ".2f"),
                fmt(r["max_ms"], ".1f"), f"{r['wall_s']:.1f}", f"{r['goodput']:.1f}", f"{r['throughput_ok']:.1f}",
                fmt(r["server_cpu_ms_per_ok"], ".2f"), "yes" if r["valid"] else "NO",
            ]
        )  # fmt: skip
    print()
    print(f"latencylab capacity (p99 <= {slo_ms:g} ms, <= 1% shed/failed): {cap_rate:.1f}/s offered, "
          f"goodput {cap_goodput:.1f}/s")  # fmt: skip
    if "naive_capacity" in out:
        nc = out["naive_capacity"]
        print(f"naive capacity (same rule): {fmt(nc['capacity_rate'])}/s offered, goodput {fmt(nc['goodput'])}/s")
    print()
    heads = ["server", "offered/s", "sent", "ok", "shed", "error", "sent=ok+shed+error", "p50 ms", "p99 ms"]
    print(table([*heads, "max ms", "wall s", "goodput/s", "ok/s", "server CPU ms/ok", "valid"], rows))
    print("(goodput and ok/s per second of wall time: first intended send to last completion, as find_capacity)")
    print()
    for m in (at_cap, ll):
        print(
            f"{m['server']}: shed by reason {m['server_shed_by_reason']}, errors by kind "
            f"{m['server_errors_by_kind']}, responses by code {m['server_requests_by_code']}, mean batch "
            f"{fmt(m['server_mean_batch_size'], '.2f')}, batches by release reason {m['server_batches_by_reason']}"
        )
        if m["server_stages_mean_ms"]:
            stages = ", ".join(f"{k} {v:.2f}" for k, v in m["server_stages_mean_ms"].items())
            print(f"    server-side stage means of ok requests (ms): {stages}; client mean (from actual send) "
                  f"{fmt(m['client_uncorrected_mean_ms'], '.2f')}, outside the server's clock "
                  f"{fmt(m['network_and_client_mean_ms'], '.2f')}; age at handler (X-Request-Start) mean of all "
                  f"requests {fmt(m['server_request_age_mean_ms'], '.2f')}")  # fmt: skip
    for r in runs:
        if r["errors_by_reason"]:
            print(f"{r['server']}: client-side errors {r['errors_by_reason']}")
        if not r["valid"]:
            print(f"{r['server']}: run marked invalid: {'; '.join(r['invalid_reasons'])}")
    print()
    print(f"p99 of ok requests per {WINDOW_S:g}-s window of intended send time, ms (ok / sent):")
    wrows = []
    for i, w in enumerate(ll["windows"]):
        row = [f"{w['from_s']:g}-{w['to_s']:g} s", f"{fmt(w['p99_ms'], '.2f')} ({w['ok']} / {w['sent']})"]
        row.append(f"{w['goodput']:.1f}")
        for nv in naives:
            nw = nv["windows"][i] if i < len(nv["windows"]) else None
            row.append(f"{fmt(nw['p99_ms'], '.0f')} ({nw['ok']} / {nw['sent']})" if nw else "-")
        wrows.append(row)
    print(table(["window", "latencylab p99", "latencylab goodput/s", *(f"{nv['server']} p99" for nv in naives)], wrows))

    # The accounting identity is not a performance claim: a request without exactly one outcome is a bug.
    for r in runs:
        assert r["identity"], f"{r['server']}: sent {r['sent']} != ok {r['ok']} + shed {r['shed']} + error {r['error']}"
    checks = [(f"sent == ok + shed + error ({r['server']})", r["identity"]) for r in runs]
    checks += [
        (f"latencylab p99 of admitted {fmt(ll['p99_ms'], '.2f')} ms <= SLO {slo_ms:g} ms",
         ll["p99_ms"] is not None and ll["p99_ms"] <= slo_ms),
        (f"latencylab goodput {ll['goodput']:.1f}/s >= 90% of capacity goodput {cap_goodput:.1f}/s",
         ll["goodput"] >= 0.9 * cap_goodput),
    ]  # fmt: skip
    for nv in naives:
        # "Grows without bound": the last window's p99 is at least twice the first's.
        p99s = [w["p99_ms"] for w in nv["windows"] if w["p99_ms"] is not None]
        growing = len(p99s) >= 2 and p99s[-1] >= 2 * p99s[0]
        trend = " -> ".join(f"{p:.0f}" for p in p99s)
        checks.append((f"{nv['server']}: p99 grows (last window >= 2 x first: {trend} ms)", growing))
    print()
    for text, passed in checks:
        ok_all &= bool(passed)
        print(f"{'PASS' if passed else 'FAIL'}  {text}")
    out["checks"] = [{"check": t, "passed": bool(p)} for t, p in checks]
    out["wall_s"] = time.perf_counter() - t_start
    print(f"\nwall time {out['wall_s']:.0f} s; {machine_load()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())

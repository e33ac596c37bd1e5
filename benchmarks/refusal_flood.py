"""What a refusal costs the server, and what a flood of them does to the requests it admits (issue 22).

Session 12's vision runs at 4x overload collapsed with the server's core half idle: it refused ~830 requests a
second and its admitted requests slowed in the thread hand-offs (docs/benchmarks/serve.md). This script
separates the two effects on the real vision server (``latencylab serve``, one-rung ladder, SLO 30 ms, default
deadline 30 ms, pinned to CPU 1; the generators on CPU 0), for each refusal path (``--modes``):

* ``head``: the connection answers the 503 from the request's head (serve/head_refusal.py, the default);
* ``app``: every request goes through uvicorn's ASGI cycle and Starlette; the handler refuses before decoding
  (serve/early.py; the server of session 12). The child runs ``latencylab serve`` with ``run_server``'s
  ``head_refusal`` off;
* ``head-asyncio``: ``head`` on the standard asyncio loop (``run_server(loop="asyncio")``), as ``run_server``
  ran every server until session 13 (``head`` and ``app`` run on uvloop from then on; the session-13 run of
  ``head`` and ``app`` was on the standard loop).

Per mode, three phases on one server, each ``--seconds`` long:

1. ``admitted``: Poisson at ``--rate`` (well under capacity: nothing is refused) from the load generator.
2. ``admitted+flood``: the same, plus a flood of requests that admission refuses (their deadline header is
   1 ms: predicted late), open loop at ``--flood`` per second from a second process over 8 keep-alive
   connections.
3. ``flood only``: the flood as fast as 16 connections go (closed loop), for the refusals/s one core can emit:
   refusals / server CPU seconds.

Printed per phase: the admitted requests' client p50/p99 (from their intended send time) and the server's mean
stage times (request, preprocess wall, queue, batch = release -> compute start, compute), the refusals/s the
flood got, the server's CPU (cores) and its CPU per refusal. Ratios: the flood's effect on each stage, head
against app.

    /tmp/lbench .venv/bin/python benchmarks/refusal_flood.py [--seconds 15] [--rate 100] [--flood 800]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import PY, delta, fmt, free_port, proc_cpu_s, server_process, table, write_serve_config
from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import infer_path, vision_payloads
from latencylab.load.reconcile import scrape
from latencylab.load.results import Slo
from latencylab.load.runner import load_test

SERVER_CPU = 1
CLIENT_CPU = 0
PATH = infer_path("vision")
STAGES = ("request", "preprocess", "queue", "batch", "compute")


def _child(mode: str, argv: list[str]) -> int:
    """``latencylab serve`` in this process; with the head refusal off (the A/B's ``app`` mode), or on the
    standard asyncio loop instead of uvloop (``head-asyncio``: how ``run_server`` ran until session 13)."""
    import latencylab.serve.app as app

    real = app.run_server
    head_refusal, loop = mode != "app", ("asyncio" if mode == "head-asyncio" else None)

    def run_server(state: Any, on_listening: Any = None, head_refusal_: bool = True, loop_: Any = None) -> None:
        real(state, on_listening, head_refusal, loop)

    app.run_server = run_server  # type: ignore[assignment]
    from latencylab.cli import main

    return int(main(argv) or 0)


async def _flood(host: str, port: int, body: bytes, rate: float | None, seconds: float, conns: int) -> dict[str, Any]:
    head = (
        f"POST {PATH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"x-latencylab-deadline-ms: 1\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    msg = head + body
    counts = {"503": 0, "other": 0}
    t_end = time.perf_counter() + seconds

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        period = conns / rate if rate else 0.0
        nxt = time.perf_counter() + (i * period / conns if rate else 0.0)
        while True:
            now = time.perf_counter()
            if now >= t_end:
                break
            if rate and nxt > now:
                await asyncio.sleep(nxt - now)
            nxt += period
            writer.write(msg)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            counts["503" if status_line.split()[1:2] == [b"503"] else "other"] += 1
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(conns)))
    return {**counts, "seconds": time.perf_counter() - t0}


def _flood_proc(url: str, body: bytes, rate: float | None, seconds: float, conns: int, q: Any) -> None:
    os.sched_setaffinity(0, {CLIENT_CPU})
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    q.put(asyncio.run(_flood(host, int(port), body, rate, seconds, conns)))


def _stage_means(d: dict[tuple[str, str], float]) -> dict[str, float]:
    out = {}
    name = "latencylab_server_stage_seconds"
    for stage in STAGES:
        tag = f'stage="{stage}"'
        s = sum(v for (n, lab), v in d.items() if n == f"{name}_sum" and tag in lab)
        c = sum(v for (n, lab), v in d.items() if n == f"{name}_count" and tag in lab)
        out[stage] = 1e3 * s / c if c else float("nan")
    return out


def phase(srv: Any, args: argparse.Namespace, body: bytes, admitted: bool, flood: float | None) -> dict[str, Any]:
    url = srv.url
    before = scrape(url) or {}
    cpu0, t0 = proc_cpu_s(srv.proc.pid), time.perf_counter()
    q: Any = mp.get_context("fork").Queue()
    fl = None
    if flood is not None:
        conns = 8 if flood else 16
        fl = mp.get_context("fork").Process(
            target=_flood_proc, args=(url, body, flood or None, args.seconds, conns, q), daemon=True
        )
        fl.start()
    res: Any = None
    if admitted:
        cfg = LoadConfig(duration_s=args.seconds, timeout_s=10.0, connections=16, request_start_header=True)
        slo = Slo(q=0.99, threshold_ns=30e6)
        res, _ = load_test(url, PATH, vision_payloads(), Poisson(args.rate, args.seed), cfg, slo, seed=args.seed)
    fres = None
    if fl is not None:
        fres = q.get(timeout=args.seconds + 30)
        fl.join(10)
    cpu1, t1 = proc_cpu_s(srv.proc.pid), time.perf_counter()
    time.sleep(0.3)
    d = delta(scrape(url) or {}, before)
    out: dict[str, Any] = {"server_cores": (cpu1 - cpu0) / (t1 - t0), "server_cpu_s": cpu1 - cpu0}
    if res is not None:
        s = res.summary
        out.update(sent=s["sent"], ok=s["ok"], shed=s["shed"], p50_ms=s.get("p50_ms"), p99_ms=s.get("p99_ms"))
        out["stages_ms"] = _stage_means(d)
    if fres is not None:
        out["refusals_per_s"] = fres["503"] / fres["seconds"]
        out["flood_other"] = fres["other"]
    return out


def run_mode(mode: str, args: argparse.Namespace, body: bytes, tmp: Path) -> dict[str, Any]:
    cfg = write_serve_config(
        tmp / f"serve-{mode}.toml",
        {"name": "vision", "ladder": ["fp32"], "slo_ms": 30.0, "default_deadline_ms": 30.0, "max_batch_size": 8},
    )
    serve = ["serve", "--config", str(cfg), "--port", str(free_port()), "--threads", "1"]
    argv = [PY, str(Path(__file__).resolve()), "--child", mode, "--", *serve]
    out: dict[str, Any] = {}
    with server_process(argv, tmp / f"serve-{mode}.log", {SERVER_CPU}) as srv:
        os.sched_setaffinity(0, {CLIENT_CPU})
        phase(srv, argparse.Namespace(**{**vars(args), "seconds": 3.0}), body, True, None)  # warm-up
        out["admitted"] = phase(srv, args, body, True, None)
        out["admitted+flood"] = phase(srv, args, body, True, args.flood)
        out["flood only"] = phase(srv, args, body, False, 0.0)
        f = out["flood only"]
        f["cpu_ms_per_refusal"] = 1e3 * f["server_cpu_s"] / max(1, f["refusals_per_s"] * args.seconds)
        f["refusals_per_core_s"] = 1e3 / f["cpu_ms_per_refusal"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="head,app")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rate", type=float, default=100.0, help="admitted load, req/s (under capacity)")
    ap.add_argument("--flood", type=float, default=800.0, help="refused requests per second during the flood")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=["head", "app", "head-asyncio"], help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.rest)
    body = vision_payloads()[0].body
    print(f"refusal flood: vision, admitted {args.rate:g}/s, flood {args.flood:g}/s, {args.seconds:g} s per phase; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="refusal-flood-") as tmp:
        for mode in args.modes.split(","):
            results[mode] = run_mode(mode, args, body, Path(tmp))
            print(f"{mode}: {json.dumps(results[mode], default=str)}", flush=True)
    rows = []
    for mode, r in results.items():
        for ph in ("admitted", "admitted+flood", "flood only"):
            m = r[ph]
            st = m.get("stages_ms", {})
            rows.append([
                mode, ph, fmt(m.get("refusals_per_s"), ".0f"), fmt(m.get("p50_ms"), ".2f"), fmt(m.get("p99_ms"), ".2f"),
                *(fmt(st.get(s), ".2f") if st else "-" for s in STAGES), fmt(m["server_cores"], ".2f"),
                fmt(m.get("cpu_ms_per_refusal"), ".3f"),
            ])  # fmt: skip
    print(table(["mode", "phase", "refusals/s", "p50 ms", "p99 ms", *[f"{s} ms" for s in STAGES], "server cores",
                 "CPU ms/refusal"], rows))  # fmt: skip
    for mode, r in results.items():
        a, f = r["admitted"].get("stages_ms", {}), r["admitted+flood"].get("stages_ms", {})
        ratios = ", ".join(f"{s} {f[s] / a[s]:.2f}x" for s in STAGES if a.get(s))
        print(f"{mode}: the flood's effect on admitted stages (with / without): {ratios}; "
              f"p99 {fmt(r['admitted+flood'].get('p99_ms'), '.2f')} vs {fmt(r['admitted'].get('p99_ms'), '.2f')} ms; "
              f"refusals per core-second {fmt(r['flood only'].get('refusals_per_core_s'), '.0f')}")  # fmt: skip
    if "head" in results and "app" in results:
        h, a = results["head"]["flood only"], results["app"]["flood only"]
        print(f"CPU per refusal, app / head: {a['cpu_ms_per_refusal'] / h['cpu_ms_per_refusal']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Overload: latencylab's server at 2x its capacity vs a naive server, both open loop, same arrivals.

The claim (issues 4, 22): offered load at 2x latencylab's capacity: the P99 of admitted requests (every
request not shed: an answer, or an error such as a 504 after admission, at its latency) stays
<= SLO in every 10-s window after the first, goodput >= 90% of capacity, and ``sent == ok + shed + error``
exactly, while the naive server's P99 grows without bound; and run after run (``--runs N``, a fresh server
and a fresh capacity search each), with capacities that agree within +/-10%.

Method

1. ``latencylab serve`` with a one-rung ladder (``["fp32"]``: the guard has nowhere to go, so this
   measures admission control and batching, not the fallback ladder), ``default_deadline_ms = SLO``
   (the server's own policy: a request it cannot answer within the SLO is refused at admission with
   503 + Retry-After rather than queued), torch at 1 thread, pinned to CPU 1. The generator stamps every
   request with ``X-Request-Start`` = its intended send time (``--no-request-start``: off), and the server
   counts the deadline from then: time before its handler runs (the generator's lateness, the socket
   queue, event-loop lag) is otherwise invisible to it but counted by the client's corrected latency.
   The naive server ignores the header.
2. Its capacity: ``search_capacity`` (latencylab.load.capacity; the same search as ``latencylab load
   --find-capacity``): one discarded warm-up run, then Poisson steps of 3 to ``--max-chunks`` chunks of
   ``--step-duration`` s (the first ``--warmup`` s of each left out), each step extended until its verdict
   is statistically decided (corrected p99 of ok <= SLO, <= 1% shed or failed); bracket, then bisect to 5%.
   The capacity's goodput (ok within the SLO per second) is the yardstick of the overload run.
3. Overload: Poisson arrivals at ``--factor`` (2) x the capacity rate for ``--duration`` s, from this
   process (the generator) pinned to CPU 0. Reported: sent / ok / shed / error (the identity is
   asserted), p99 of ok requests from the intended send time (coordinated-omission corrected), goodput,
   shed reasons and error kinds from the server's /metrics, and p99 per 10-s window.
4. benchmarks/serve_naive.py (same variant object, same OIP codec, one forward per request, unbounded FIFO,
   no admission control; a fresh process per run), overloaded by the same factor: first a 5-s probe measures
   its CPU per answered request, whose inverse is its ceiling (one process on one CPU); it is then offered
   ``--factor`` x the larger of latencylab's capacity and that ceiling (Poisson, same seed), since on vision
   it is cheaper per request than latencylab and 2x latencylab's capacity can be under its own ceiling
   (``--naive-at-same-rate``: latencylab's overload rate regardless). Its per-request timeout is
   ``--duration`` s (beyond that a request counts as an error), so the run stays bounded. Its collapse: the
   p99 of its last 10-s window is at least twice its first's, and over the SLO.
5. Server CPU per successful request (from /proc, all threads) for every run: what each request costs.

Why the SLO: a vision request costs the server ~3 ms of CPU (HTTP + JSON + base64 + JPEG decode + resize
+ a 0.6-ms forward), so a 100 ms SLO is ~30x the work and hardly constrains anything; 30 ms (~10x) makes
queueing, which admission control exists to govern, the dominant term of the tail, while leaving room
for the 4 ms batching delay and loopback noise. Text at 1 thread is a poor fit for this claim on these
CPUs: the corpus's 256-token passages take ~100 ms alone, so with a 100 ms SLO the "capacity" is set by
service time (measured 8.8/s) far below the throughput ceiling, and 2x of it is no overload at all. With admission
aiming at 90% of the SLO, text at 100 ms has no capacity at all (its longest passages are refused at every
rate, 2.3% of requests): issue 22's text runs use ``--slo-ms 150``.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/serve_overload.py [--model vision|text]
        [--slo-ms 30] [--runs 3] [--duration 60 | --quick] [--json /tmp/overload.json]

Each run is judged on its own (PASS/FAIL per claim), and the spread over runs is reported: capacity median
and min-max (+/-% from the median), p99 of admitted and goodput min-max. Exit status 0 when every claim holds
in every run and the capacities agree within +/-10%, 1 otherwise (the tables say which).
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import (
    PY,
    ROOT,
    ForeignCpu,
    StealTrace,
    by_label,
    cpu_model,
    delta,
    fmt,
    free_port,
    machine_load,
    proc_cpu_s,
    server_process,
    table,
    wait_quiet,
    windows,
    write_serve_config,
)
from latencylab.load.arrivals import Poisson
from latencylab.load.capacity import Capacity, SearchConfig, Segment, search_capacity
from latencylab.load.generator import LoadConfig, Payload, Records
from latencylab.load.mix import Stratified
from latencylab.load.payloads import infer_path, text_payloads, vision_payloads
from latencylab.load.reconcile import scrape, server_stage_means
from latencylab.load.results import LoadResult, Slo
from latencylab.load.runner import load_test

SERVER_CPU = 1
CLIENT_CPU = 0
WINDOW_S = 10.0
NAIVE_PROBE_S = 5.0
# A chunk (or run) during which other processes used more than this many CPUs on average measured the machine,
# not the server: the search reruns such a chunk (after waiting for a quiet machine); overload runs report it.
FOREIGN_CPU_LIMIT = 0.15
# The same for the host's other tenants (/proc/stat's steal, ForeignCpu.steal): a capacity chunk during which the
# hypervisor took more than this many CPUs from the VM is rerun; an overload run with a 10-s window over it is run
# again (--steal-retries), every try reported (session 20: ~70 CPU-s stolen in 17 min, a run's last windows at
# 110 ok/s where the same server had served 330/s).
STEAL_LIMIT = 0.10
DISCARDED_KEYS = ("offered_rate", "sent", "ok", "shed", "error", "goodput", "p99_admitted_ms", "windows",
                  "steal_cpu", "steal_per_window", "learned_margin_ms_at_end")  # fmt: skip
# Text requests' costs span 10x (a long passage ~ 100 ms of compute at one thread): near capacity a long passage
# arriving behind another cannot be admitted inside the target, so a few % are shed at every rate from ~25/s to
# ~40/s (session 9: 0.7-2.6%, flat), and a 1% allowance picked the capacity by binomial noise on that plateau
# (24.4-40/s). 5% sits where the shed fraction rises steeply (7.5% at 49/s, 21% at 80/s in session 9).
TEXT_MAX_SHED = 0.05


def payloads_for(model: str) -> list[Payload]:
    return vision_payloads() if model == "vision" else text_payloads()


# The payload mix per model (--payload-mix): "stratified" sends every 20 consecutive requests one payload of each
# 5% cost stratum (latencylab.load.mix; docs/metrics.md, "Capacity: the text workload"), "random" draws each.
PAYLOAD_MIX = {"vision": "random", "text": "stratified"}
_MIX: dict[str, str] = {"mix": "random"}  # set once by main()


def run_once(
    url: str, path: str, payloads: list[Payload], rate: float, duration_s: float, timeout_s: float,
    slo: Slo, seed: int, env: dict[str, Any], abort_when: Any = None, request_start: bool = True,
) -> tuple[LoadResult, Records]:  # fmt: skip
    cfg = LoadConfig(duration_s=duration_s, timeout_s=timeout_s, connections=32, request_start_header=request_start)
    arrivals: Any = Poisson(rate, seed)
    if _MIX["mix"] == "stratified":  # cost = body size (text: passage length, which sets its tokens)
        arrivals = Stratified.of(arrivals, [len(p.body) for p in payloads], strata=20, seed=seed)
    return load_test(url, path, payloads, arrivals, cfg, slo, seed=seed, abort_when=abort_when, env=env)


# The host's speed, read on the model itself: a light Poisson load (almost every batch of one), the same arrivals
# and payloads every run, before the capacity search and after the overload runs. Its figure is the server's mean
# preprocess + compute time per request; capacity x that figure is the capacity in units of the model's own
# light-load service rate, which does not move when the host's speed does (docs/benchmarks/serve.md).
PROBE = {"vision": (10.0, 10.0), "text": (3.0, 15.0)}  # rate/s, seconds


def speed_probe(url: str, path: str, payloads: list[Payload], model: str, slo: Slo) -> dict[str, Any]:
    """The server's mean preprocess + compute ms per request at a light load (``PROBE``), its mean batch size."""
    rate, seconds = PROBE[model]
    before = scrape(url) or {}
    res, _ = run_once(url, path, payloads, rate, seconds, 30.0, slo, 4242, {})
    after = scrape(url) or {}
    stages = server_stage_means(before, after)
    d = delta(after, before)
    pre, comp = stages.get("preprocess", {}).get("mean_ms"), stages.get("compute", {}).get("mean_ms")
    return {
        "rate": rate, "seconds": seconds, "ok": res.summary["ok"],
        "service_ms": None if pre is None or comp is None else pre + comp,
        "preprocess_ms": pre, "compute_ms": comp, "mean_batch_size": mean_batch_size(d),
    }  # fmt: skip


def mean_batch_size(d: dict[tuple[str, str], float]) -> float | None:
    """The server's mean batch size over a scrape delta, or None when it ran no batch."""
    total = sum(v for (n, _), v in d.items() if n == "latencylab_server_batch_size_sum")
    n_batches = sum(v for (n, _), v in d.items() if n == "latencylab_server_batch_size_count")
    return total / n_batches if n_batches else None


def probe_line(p: dict[str, Any]) -> str:
    return (f"speed probe ({p['rate']:g}/s for {p['seconds']:g} s, {p['ok']} ok): preprocess + compute "
            f"{fmt(p['service_ms'], '.2f')} ms a request (compute {fmt(p['compute_ms'], '.2f')} ms, mean batch "
            f"{fmt(p['mean_batch_size'], '.2f')})")  # fmt: skip


def capacity_search(
    url: str, path: str, payloads: list[Payload], slo: Slo, args: argparse.Namespace, seed: int, server_pid: int
) -> Capacity:
    env: dict[str, Any] = {"note": "serve_overload capacity step"}
    # A chunk the generator itself invalidated (> 1% of sends > 1 ms late: on a shared 2-vCPU VM, a host
    # hiccup) is kept when at most --max-late-fraction of its sends were late (their latency counts from the
    # intended send, so it can only look worse), else rerun (twice at most); both are counted per step.
    chunks: list[dict[str, Any]] = []  # per chunk: its rate and the server's speed readings (step_speed)
    phase = ["search"]  # "refine" from the refine phase's first chunk (its rates may repeat a bisection step's)
    cfg = SearchConfig(
        start_rate=args.start_rate, precision=0.05, chunk_s=args.step_duration, max_chunks=args.max_chunks,
        warmup_s=args.warmup, search_warmup_s=args.step_duration, confidence=0.95,
        max_late_fraction=args.max_late_fraction, invalid_retries=args.busy_retries,
        max_error_fraction=args.max_shed, cooldown_s=args.cooldown, refine_rounds=args.refine_rounds,
    )  # fmt: skip

    def measure(rate: float, seconds: float, s: int, abort_when: Any) -> Segment:
        # a quiet machine first: no other process, and a host not stealing (over 2 s: steal comes in bursts)
        waited = wait_quiet([server_pid], FOREIGN_CPU_LIMIT, probe_s=2.0, max_wait_s=60.0, steal_limit=STEAL_LIMIT)
        if waited >= 1.0:
            print(f"    (waited {waited:.0f} s for other processes to leave the CPUs, the host to stop stealing)",
                  flush=True)  # fmt: skip
        cpu0 = proc_cpu_s(server_pid)
        with ForeignCpu([server_pid]) as fc:
            res, rec = run_once(url, path, payloads, rate, seconds, 10.0, slo, s, env, abort_when, args.request_start)
        time.sleep(0.3)  # let the server drain before the next chunk
        stages = (res.server or {}).get("server_stages_mean_ms") or {}
        chunks.append({
            "valid": fc.cpus <= FOREIGN_CPU_LIMIT and fc.steal <= STEAL_LIMIT, "phase": phase[0],
            "sent": int(rec.intended_ns.size), "steal": fc.steal,
            "rate": rate, "requests": int((res.server or {}).get("server_requests") or 0), "ok": int(res.summary["ok"]),
            "preprocess_ms": stages.get("preprocess"), "server_cpu_s": proc_cpu_s(server_pid) - cpu0,
        })  # fmt: skip
        seg = Segment.from_run(rate, res, rec)
        if fc.cpus > FOREIGN_CPU_LIMIT or fc.steal > STEAL_LIMIT:  # rerun by the search (invalid_retries), not judged
            why = (f"machine busy: other processes used {fc.cpus:.2f} CPU on average" if fc.cpus > FOREIGN_CPU_LIMIT
                   else f"host busy: the hypervisor took {fc.steal:.2f} CPU from the VM (steal)")  # fmt: skip
            print(f"    chunk at {rate:g}/s not counted: {why}", flush=True)
            return dataclasses.replace(seg, valid=False, late_only=False, why_invalid=why)
        return seg

    def on_chunk(c: dict[str, Any]) -> None:
        # the refine phase's chunks (interleaved rounds): one line each, with the host's speed reading
        if c.get("phase") != "refine":
            return
        phase[0] = chunks[-1]["phase"] = "refine"
        last = chunks[-1]
        print(f"    refine round {c['round']} at {c['offered_rate']:g}/s: {last['ok']} ok of {last['sent']} sent, "
              f"preprocess {fmt(last['preprocess_ms'], '.3f')} ms, steal {last['steal']:.3f}"
              f"{'' if c['counted'] else ' (not counted)'}", flush=True)  # fmt: skip

    def on_step(s: dict[str, Any]) -> None:
        # the step's speed readings, into the step itself (the dict the search keeps in Capacity.steps)
        ph = s.get("phase", "search")
        s.update(step_speed([c for c in chunks if c["rate"] == s["offered_rate"] and c["phase"] == ph]))
        print(
            f"  {'refined' if ph == 'refine' else 'offered'} {s['offered_rate']:7.1f}/s  "
            f"goodput {fmt(s.get('goodput'))}/s  "
            f"p99 {fmt(s.get('p99_ms'), '.2f')} ms  sent {s.get('sent')}  {s['chunks']} chunks "
            f"(server: preprocess {fmt(s['server_preprocess_ms'], '.3f')} ms a request, "
            f"CPU {fmt(s['server_cpu_ms_per_ok'], '.2f')} ms an ok)  "
            f"({s['late_chunks_kept']} late kept, {s['invalid_chunks']} rerun)  "
            f"{s['verdict']}{'' if s['passed'] else ' (FAIL)'}: {s['why']}",
            flush=True,
        )

    # each rate is one step (the start rate's discarded warm-up run counts in with it)
    return search_capacity(measure, slo, cfg, seed=seed, on_step=on_step, on_chunk=on_chunk)


def step_speed(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's speed during one step, read on the server's own work: its mean preprocess ms a request (a fixed
    work per request: vision JPEG decode + resize, text tokenising; weighted by requests over the step's chunks)
    and its CPU ms per ok request (which batching also moves)."""
    chunks = [c for c in chunks if c["valid"]]  # not the chunks another process slowed (rerun, never judged)
    pre = [(c["preprocess_ms"], c["requests"]) for c in chunks if c["preprocess_ms"] is not None and c["requests"]]
    n_pre = sum(n for _, n in pre)
    ok = sum(c["ok"] for c in chunks)
    return {
        "server_preprocess_ms": sum(ms * n for ms, n in pre) / n_pre if n_pre else None,
        "server_cpu_ms_per_ok": 1e3 * sum(c["server_cpu_s"] for c in chunks) / ok if ok else None,
    }


def judge_unstolen(
    run: Callable[[], dict[str, Any]], label: str, retries: int, cooldown_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:  # fmt: skip
    """An overload run (``run()``), run again at most ``retries`` times while the host took more than STEAL_LIMIT
    CPU from the VM in one of its 10-s windows (``steal_per_window``); the last try is judged whatever its steal,
    and the ones before it are kept under ``discarded_tries`` (reported, never dropped)."""
    tries: list[dict[str, Any]] = []
    while True:
        m = run()
        stolen = max(m.get("steal_per_window") or [], default=0.0)
        m["steal_over_limit"] = stolen > STEAL_LIMIT
        if not m["steal_over_limit"] or len(tries) >= retries:
            m["discarded_tries"] = tries
            return m
        print(f"  {label}: not judged: the host took {stolen:.2f} CPU from the VM in one 10-s window "
              f"(> {STEAL_LIMIT:g}); run again after {cooldown_s:g} s")  # fmt: skip
        tries.append({k: m.get(k) for k in DISCARDED_KEYS})
        sleep(cooldown_s)


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
        # every request not shed (ok and error: a 504 after admission is a miss of the admitted, at its latency)
        "p99_admitted_ms": float(np.quantile(lat_ms[rec.outcome != 1], 0.99)) if (rec.outcome != 1).any() else None,
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
        "tail": tail_evidence(rec, slo_ms, duration_s),
    }


def tail_evidence(rec: Records, slo_ms: float, duration_s: float, bin_s: float = 0.5) -> list[dict[str, Any]]:
    """Where the answers over the SLO come from, per 10-s window, from the generator's records alone (nothing is
    asked of the server while it runs): how many ok answers were over the SLO and how bunched they were (the
    most in one ``bin_s`` bin of intended send time, and in how many bins they fell), how late their sends went
    out against every ok's (the generator's own share), and the server's stalls as seen from outside: the longest
    gap between consecutive answers of any kind (503s included; at hundreds per second a gap over 20 ms means
    the server answered nothing), and how many gaps exceeded 20 ms. (Issue 22, session 14.)"""
    lat_ms = (rec.done_ns - rec.intended_ns) / 1e6
    late_ms = (rec.sent_ns - rec.intended_ns) / 1e6
    ok = rec.outcome == 0
    width = int(WINDOW_S * 1e9)
    n_win = max(1, round(duration_s / WINDOW_S))
    done = np.sort(rec.done_ns[rec.done_ns > 0])
    out = []
    for b in range(n_win):
        m = (rec.intended_ns // width) == b
        over = m & ok & (lat_ms > slo_ms)
        bins = ((rec.intended_ns[over] - b * width) // int(bin_s * 1e9)).astype(np.int64)
        counts = np.bincount(bins) if bins.size else np.zeros(1, dtype=np.int64)
        d = done[(done >= b * width) & (done < (b + 1) * width)]
        gaps = np.diff(d) / 1e6 if d.size > 1 else np.zeros(1)
        out.append({
            "ok": int((m & ok).sum()),
            "over_slo": int(over.sum()),
            "over_max_in_bin": int(counts.max()),
            "over_bins": int((counts > 0).sum()),
            "over_send_late_p50_ms": float(np.median(late_ms[over])) if over.any() else None,
            "ok_send_late_p99_ms": float(np.quantile(late_ms[m & ok], 0.99)) if (m & ok).any() else None,
            "answer_gap_max_ms": float(gaps.max()),
            "answer_gaps_over_20ms": int((gaps > 20.0).sum()),
        })  # fmt: skip
    return out


def hist_quantile(d: dict[tuple[str, str], float], name: str, q: float, **labels: str) -> float | None:
    """The ``q`` quantile (ms) of a Prometheus histogram's increase between two scrapes (``d``: their delta), by
    linear interpolation inside its bucket (the server's stage buckets are 5% of the SLO apart near it)."""
    cum: dict[float, float] = {}
    for (n, lab), v in d.items():
        if n != f"{name}_bucket" or not all(f'{k}="{val}"' in lab for k, val in labels.items()):
            continue
        le = lab.split('le="', 1)[1].split('"', 1)[0]
        edge = float("inf") if le == "+Inf" else float(le)
        cum[edge] = cum.get(edge, 0.0) + v
    edges = sorted(cum)
    if not edges or cum[edges[-1]] <= 0:
        return None
    rank = q * cum[edges[-1]]
    lo_edge, lo_n = 0.0, 0.0
    for e in edges:
        if cum[e] >= rank:
            if e == float("inf"):
                return 1e3 * lo_edge
            return 1e3 * (lo_edge + (e - lo_edge) * (rank - lo_n) / max(cum[e] - lo_n, 1e-9))
        lo_edge, lo_n = e, cum[e]
    return None


def tail_line(m: dict[str, Any]) -> str:
    """The tail evidence of one overload run, one line per window."""
    rows = []
    for i, t in enumerate(m["tail"]):
        rows.append(
            f"    window {i + 1}: {t['over_slo']} of {t['ok']} ok over the SLO (at most {t['over_max_in_bin']} in one "
            f"0.5-s bin, in {t['over_bins']} bins; send lateness p50 {fmt(t['over_send_late_p50_ms'], '.2f')} ms, "
            f"every ok's p99 {fmt(t['ok_send_late_p99_ms'], '.2f')} ms); longest gap between answers "
            f"{t['answer_gap_max_ms']:.1f} ms, {t['answer_gaps_over_20ms']} over 20 ms"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["vision", "text"], default="vision")
    ap.add_argument("--slo-ms", type=float, help="p99 objective (default: vision 30, text 100)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of overload per server (default 60)")
    ap.add_argument("--runs", type=int, default=3, help="independent runs (fresh servers, fresh searches)")
    ap.add_argument("--quick", action="store_true", help="30-s overload runs, 5-s capacity chunks, no at-capacity run")
    ap.add_argument("--step-duration", type=float, default=6.0, help="seconds per capacity chunk")
    ap.add_argument("--max-chunks", type=int, default=6, help="chunks per capacity step at most (at least 3)")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds left out at the start of every chunk")
    ap.add_argument(
        "--refine-rounds", type=int, default=4,
        help="capacity: after a 15%% bracket, this many interleaved rounds over a grid of rates around it, judged on "
        "a monotone fit (load/capacity_refine.py; 0 = bisect to 5%% and stop, the search before session 22)",
    )  # fmt: skip
    ap.add_argument(
        "--max-late-fraction", type=float, default=0.05,
        help="capacity: keep a chunk whose only flaw is this fraction of sends > 1 ms late (default 5%%)",
    )  # fmt: skip
    ap.add_argument(
        "--cooldown", type=float, default=8.0,
        help="capacity: idle seconds before each step, so the server's learned admission margin relaxes from the "
        "step before (SearchConfig.cooldown_s; default 8: from its ceiling, 0.5 x SLO, it takes 2 + 6 s)",
    )  # fmt: skip
    ap.add_argument("--at-capacity-s", type=float, default=10.0, help="seconds at the capacity (0 = skip)")
    ap.add_argument("--start-rate", type=float, help="first capacity step (default: vision 100/s, text 10/s)")
    ap.add_argument("--capacity", type=float, help="skip the search: use this capacity (req/s)")
    ap.add_argument("--factor", type=float, default=2.0, help="overload = factor x capacity")
    ap.add_argument(
        "--also-factor", type=float, action="append", default=[], metavar="F",
        help="after the --factor overload, overload the same server at F x capacity too (latencylab only, same "
        "checks; repeatable, e.g. --also-factor 4)",
    )  # fmt: skip
    ap.add_argument(
        "--max-shed", type=float,
        help="capacity: the most a passing step may shed or fail (SearchConfig.max_error_fraction; default: "
        "vision 1%%, text 5%%, see docs/metrics.md 'Capacity')",
    )  # fmt: skip
    ap.add_argument("--deadline-ms", type=float, help="server's default_deadline_ms (default: the SLO)")
    ap.add_argument(
        "--payload-mix", choices=["random", "stratified"],
        help="payload per request: drawn at random, or stratified by cost (every 20 requests one of each 5%% "
        "stratum; latencylab.load.mix); default: vision random, text stratified",
    )  # fmt: skip
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
    ap.add_argument(
        "--preprocess-pool", action="store_true",
        help="vision: preprocess in the server's preprocess pool (until session 18) instead of in the batch",
    )  # fmt: skip
    ap.add_argument("--no-gc-freeze", action="store_true", help="serve with gc_freeze = false (for comparison)")
    ap.add_argument(
        "--no-admit-when-idle",
        action="store_true",
        help="serve with admit_when_idle = false (until session 19: the learned pad refuses an idle batcher too)",
    )
    ap.add_argument(
        "--steal-retries", type=int, default=2,
        help="run an overload run again, at most this many times, while a 10-s window of it had more than "
        f"{STEAL_LIMIT:g} CPU stolen by the host (every try is reported; default 2)",
    )  # fmt: skip
    ap.add_argument(
        "--busy-retries", type=int, default=6,
        help="rerun a capacity chunk the generator invalidated or other processes disturbed (more than "
        f"{FOREIGN_CPU_LIMIT:g} CPU on average) at most this often before the step counts as invalid",
    )  # fmt: skip
    ap.add_argument(
        "--naive-at-same-rate", dest="naive_own_ceiling", action="store_false",
        help="offer the naive server latencylab's overload rate even when its own ceiling (1 / CPU per request, "
        "from a 5-s probe) is higher (default: factor x the larger of the two)",
    )  # fmt: skip
    ap.add_argument(
        "--combine", nargs="+", metavar="JSON",
        help="run nothing: the verdict and the spreads over the runs of these --json outputs (e.g. three --runs 1 "
        "invocations run at different times)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON")
    args = ap.parse_args()
    if args.refine_rounds < 0:
        ap.error(f"--refine-rounds must be at least 0, got {args.refine_rounds}")
    if args.max_chunks < 3:  # the search's p99 test needs 3 chunks (load/early_stop.MIN_BLOCKS)
        ap.error(f"--max-chunks must be at least 3, got {args.max_chunks}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.combine:
        return combine(args.combine)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID prints every thread's stack (a stuck run)
    if args.quick:
        args.duration = 30.0
        args.step_duration = 5.0
        args.at_capacity_s = 0.0
    slo_ms = args.slo_ms or (30.0 if args.model == "vision" else 100.0)
    args.start_rate = args.start_rate or (100.0 if args.model == "vision" else 10.0)
    args.payload_mix = args.payload_mix or PAYLOAD_MIX[args.model]
    _MIX["mix"] = args.payload_mix
    if args.max_shed is None:
        args.max_shed = TEXT_MAX_SHED if args.model == "text" else 0.01
    slo = Slo(0.99, slo_ms * 1e6)
    pin = None if args.no_pin or (os.cpu_count() or 1) < 2 else {SERVER_CPU}
    if pin:
        os.sched_setaffinity(0, {CLIENT_CPU})
    origin = "X-Request-Start (intended send)" if args.request_start else "handler start"
    print(f"serve_overload: model {args.model}, SLO p99 <= {slo_ms:g} ms, server deadline "
          f"{args.deadline_ms or slo_ms:g} ms from {origin}, payload mix {args.payload_mix}, "
          f"{machine_load()}")  # fmt: skip
    payloads = payloads_for(args.model)
    path = infer_path(args.model)
    out: dict[str, Any] = {"model": args.model, "slo_ms": slo_ms, "args": vars(args), "load_before": os.getloadavg()}
    out["cpu"] = cpu_model()
    print(f"CPU: {out['cpu']}")
    t_start = time.perf_counter()

    runs: list[dict[str, Any]] = []
    for k in range(args.runs):
        print(f"\n=== run {k + 1} of {args.runs} ({machine_load()})")
        runs.append(one_run(args, slo, payloads, path, pin, args.seed + 1000 * k))
    out["runs"] = runs
    report(out, runs, slo_ms)
    out["wall_s"] = time.perf_counter() - t_start
    out["load_after"] = os.getloadavg()
    print(f"\nwall time {out['wall_s']:.0f} s; {machine_load()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0 if out["all_passed"] else 1


def combine(paths: list[str]) -> int:
    """The report over the runs of several ``--json`` outputs of one model and SLO."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len({(d["model"], d["slo_ms"]) for d in docs}) != 1:
        print("serve_overload: --combine: the files are of different models or SLOs", file=sys.stderr)
        return 2
    runs = [r for d in docs for r in d["runs"]]
    print(f"serve_overload: {len(runs)} runs of model {docs[0]['model']} (SLO p99 <= {docs[0]['slo_ms']:g} ms) from "
          f"{', '.join(paths)}")  # fmt: skip
    out: dict[str, Any] = {}
    report(out, runs, docs[0]["slo_ms"])
    return 0 if out["all_passed"] else 1


def one_run(
    args: argparse.Namespace, slo: Slo, payloads: list[Payload], path: str, pin: set[int] | None, seed: int
) -> dict[str, Any]:
    """One run: a fresh latencylab server, its capacity, at capacity, at factor x capacity, then the naive
    server at the same rate (a fresh process); judged on its own."""
    slo_ms = slo.threshold_ns / 1e6
    out: dict[str, Any] = {"seed": seed, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="serve-overload-") as tmp:
        cfg = write_serve_config(
            Path(tmp) / "serve.toml",
            {
                "name": args.model,
                "ladder": ["fp32"],
                "slo_ms": slo_ms,
                "default_deadline_ms": args.deadline_ms or slo_ms,
                "max_batch_size": args.max_batch_size,
                # vision: preprocess in the batch, on the compute thread (no pool hand-offs; one core overlaps
                # nothing); text cannot (its cost bucket is known only once preprocessed)
                "preprocess_in_batch": args.model == "vision" and not args.preprocess_pool,
                "admit_when_idle": not args.no_admit_when_idle,
            },
            server={"gc_freeze": not args.no_gc_freeze},
        )
        argv = [PY, "-m", "latencylab", "serve", "--config", str(cfg), "--port", str(free_port())]
        argv += ["--threads", str(args.threads)]
        log = Path(tmp) / "latencylab-serve.log"
        with server_process(argv, log, pin) as srv:
            url = srv.url
            out["probe_before"] = speed_probe(url, path, payloads, args.model, slo)
            print(f"  before: {probe_line(out['probe_before'])}")
            if args.capacity:
                cap_rate, cap_goodput = args.capacity, args.capacity
                out["capacity"] = {"given": args.capacity, "capacity_rate": args.capacity, "goodput": args.capacity}
            else:
                print(f"capacity search on {url}{path} (chunks of {args.step_duration:g} s):", flush=True)
                t0 = time.perf_counter()
                cap = capacity_search(url, path, payloads, slo, args, seed, srv.proc.pid)
                out["capacity"] = {**cap.to_dict(), "search_s": time.perf_counter() - t0}
                print(f"capacity: {cap.capacity_rate}/s offered, goodput {fmt(cap.goodput)}/s ({cap.reason}; "
                      f"{out['capacity']['search_s']:.0f} s)")  # fmt: skip
                if cap.capacity_rate is None or cap.goodput is None:
                    print("no capacity found: nothing to overload")
                    out["checks"] = [{"check": "a capacity was found", "passed": False}]
                    return out
                cap_rate, cap_goodput = cap.capacity_rate, cap.goodput
            rate = args.factor * cap_rate

            def measure(label: str, r: float, duration_s: float) -> dict[str, Any]:
                time.sleep(2.0)
                waited = wait_quiet(
                    [srv.proc.pid], FOREIGN_CPU_LIMIT, probe_s=2.0, max_wait_s=60.0, steal_limit=STEAL_LIMIT
                )
                before = scrape(url) or {}
                cpu0 = proc_cpu_s(srv.proc.pid)
                with ForeignCpu([srv.proc.pid]) as fc, StealTrace() as st:
                    res, rec = run_once(
                        url, path, payloads, r, duration_s, 30.0, slo, seed, {}, None, args.request_start
                    )  # fmt: skip
                cpu1 = proc_cpu_s(srv.proc.pid)
                time.sleep(0.5)
                d = delta(scrape(url) or {}, before)
                m = summarise(label, res, rec, slo_ms, duration_s)
                m["server_cpu_ms_per_ok"] = 1e3 * (cpu1 - cpu0) / max(1, m["ok"])
                m["foreign_cpu"], m["waited_quiet_s"] = fc.cpus, waited
                m["steal_cpu"], m["steal_per_window"] = fc.steal, st.per_window(10.0)
                print(f"  {label}: other processes used {fc.cpus:.2f} CPU meanwhile (waited {waited:.0f} s before); "
                      f"the host took {fc.steal:.3f} CPU from the VM (steal per 10-s window: "
                      f"{', '.join(f'{v:.3f}' for v in m['steal_per_window'])})")  # fmt: skip
                m["server_shed_by_reason"] = by_label(d, "latencylab_server_shed_total", "reason")
                m["server_errors_by_kind"] = by_label(d, "latencylab_server_errors_total", "kind")
                m["server_requests_by_code"] = by_label(d, "latencylab_server_requests_total", "code")
                # where each 504 was when its deadline passed (preprocess, queued, computing, release_*)
                misses = by_label(d, "latencylab_server_deadline_misses_total", "where")
                m["server_misses_by_where"] = {k: int(v) for k, v in sorted(misses.items()) if v}
                if m["server_misses_by_where"]:
                    where = ", ".join(f"{k} {v}" for k, v in m["server_misses_by_where"].items())
                    print(f"  {label}: the server's 504s by where the request was at its deadline: {where}")
                # the server's garbage collections (every thread stops for one): count and total by generation
                gcn = by_label(d, "latencylab_server_gc_pause_seconds_count", "generation")
                gcs = by_label(d, "latencylab_server_gc_pause_seconds_sum", "generation")
                m["server_gc"] = {
                    g: {"n": int(gcn[g]), "total_ms": 1e3 * gcs.get(g, 0.0)} for g in sorted(gcn) if gcn[g]
                }
                if m["server_gc"]:
                    gc_line = ", ".join(
                        f"gen {g}: {v['n']} ({v['total_ms']:.0f} ms)" for g, v in m["server_gc"].items()
                    )
                    print(f"  {label}: the server's garbage collections: {gc_line}")
                m["server_mean_batch_size"] = mean_batch_size(d)
                m["server_stages_mean_ms"] = dict(res.server["server_stages_mean_ms"]) if res.server else None
                # the server's own view of its tail, over the whole run (histograms scraped before and after):
                # handler start -> response built, and the age on arrival at the handler (from X-Request-Start)
                stage = "latencylab_server_stage_seconds"
                m["server_request_p99_ms"] = hist_quantile(d, stage, 0.99, stage="request")
                m["server_age_p99_ms"] = hist_quantile(d, "latencylab_server_request_age_at_handler_seconds", 0.99)
                margin = by_label(scrape(url) or {}, "latencylab_server_admission_margin_seconds", "variant")
                m["learned_margin_ms_at_end"] = 1e3 * max(margin.values()) if margin else None
                print(f"  {label}: learned admission margin at the end {fmt(m['learned_margin_ms_at_end'], '.2f')} ms")
                print(f"  {label}: the server's p99 handler -> response {fmt(m['server_request_p99_ms'], '.2f')} ms, "
                      f"age at the handler {fmt(m['server_age_p99_ms'], '.2f')} ms (whole run; "
                      f"the age counts refused requests too); the tail (generator's records)",
                      flush=True)  # fmt: skip
                print(tail_line(m), flush=True)
                return m

            if args.at_capacity_s > 0:
                print(f"at capacity: Poisson {cap_rate:.1f}/s for {args.at_capacity_s:g} s")
                out["latencylab_at_capacity"] = measure("latencylab @ capacity", cap_rate, args.at_capacity_s)

            def judged(label: str, r: float, duration_s: float) -> dict[str, Any]:
                return judge_unstolen(lambda: measure(label, r, duration_s), label, args.steal_retries, args.cooldown)

            print(f"overload: Poisson {rate:.1f}/s ({args.factor:g} x {cap_rate:.1f}) for {args.duration:g} s")
            ll = judged("latencylab", rate, args.duration)
            out["latencylab"] = ll
            extra: list[dict[str, Any]] = []
            for f in args.also_factor:
                print(f"overload: Poisson {f * cap_rate:.1f}/s ({f:g} x {cap_rate:.1f}) for {args.duration:g} s")
                extra.append({"factor": f, **judged(f"latencylab @ {f:g}x", f * cap_rate, args.duration)})
            out["latencylab_also"] = extra
            time.sleep(args.cooldown)
            out["probe_after"] = speed_probe(url, path, payloads, args.model, slo)
            print(f"  after: {probe_line(out['probe_after'])}")
        out["latencylab_log_tail"] = log.read_text(encoding="utf-8", errors="replace")[-2000:]

        nv: dict[str, Any] | None = None
        if not args.skip_naive:
            argv = [PY, str(ROOT / "benchmarks" / "serve_naive.py"), "--model", args.model, "--port", "0"]
            argv += ["--threads", str(args.threads)]
            log = Path(tmp) / "naive.log"
            with server_process(argv, log, pin) as srv:
                time.sleep(1.0)
                # The naive server's own ceiling: its CPU per answered request over a short probe at the overload
                # rate (one process pinned to one CPU: it cannot answer faster than 1 / CPU-per-request). It is
                # cheaper per request than latencylab on vision (no admission, no batching bookkeeping), so
                # `factor` x latencylab's capacity may be no overload for it; it gets `factor` x the larger.
                cpu0 = proc_cpu_s(srv.proc.pid)
                probe, _ = run_once(srv.url, path, payloads, rate, NAIVE_PROBE_S, 10.0, slo, seed + 1, {}, None,
                                    args.request_start)  # fmt: skip
                cpu_ms = 1e3 * (proc_cpu_s(srv.proc.pid) - cpu0) / max(1, probe.summary["ok"])
                ceiling = 1e3 / cpu_ms if cpu_ms > 0 else 0.0
                naive_rate = args.factor * max(cap_rate, ceiling) if args.naive_own_ceiling else rate
                time.sleep(2.0)
                print(f"naive: CPU {cpu_ms:.2f} ms per answer (ceiling {ceiling:.1f}/s); Poisson {naive_rate:.1f}/s "
                      f"for {args.duration:g} s (request timeout {args.duration:g} s)")  # fmt: skip
                cpu0 = proc_cpu_s(srv.proc.pid)
                res, rec = run_once(
                    srv.url, path, payloads, naive_rate, args.duration, args.duration, slo, seed, {}, None,
                    args.request_start,
                )  # fmt: skip
                nv = summarise("naive", res, rec, slo_ms, args.duration)
                nv["server_cpu_ms_per_ok"] = 1e3 * (proc_cpu_s(srv.proc.pid) - cpu0) / max(1, nv["ok"])
                nv["probe_cpu_ms_per_ok"] = cpu_ms
                nv["ceiling_rate"] = ceiling
            out["naive"] = nv

    # The accounting identity is not a performance claim: a request without exactly one outcome is a bug.
    for r in [ll, *([nv] if nv else [])]:
        assert r["identity"], f"{r['server']}: sent {r['sent']} != ok {r['ok']} + shed {r['shed']} + error {r['error']}"
    worst = _worst(ll)
    checks = _overload_checks(ll, args.factor, slo_ms, cap_goodput)
    for e in extra:
        checks += _overload_checks(e, e["factor"], slo_ms, cap_goodput)
        e["worst_window_p99_ms"] = _worst(e)
        e["goodput_fraction"] = e["goodput"] / cap_goodput
    out["p99_whole_run_ms"] = _adm(ll)
    out["p99_ok_whole_run_ms"] = ll["p99_ms"]
    out["worst_window_p99_ms"] = worst
    out["goodput_fraction"] = ll["goodput"] / cap_goodput
    if nv is not None:
        # "Grows without bound": the last window's p99 is at least twice the first's, and over the SLO.
        p99s = [w["p99_ms"] for w in nv["windows"] if w["p99_ms"] is not None]
        growing = len(p99s) >= 2 and p99s[-1] >= 2 * p99s[0] and p99s[-1] > slo_ms
        trend = " -> ".join(f"{p:.0f}" for p in p99s)
        checks.append((f"naive server at {nv.get('offered_rate', rate):.1f}/s collapses: p99 per window {trend} ms "
                       f"(last >= 2 x first, > SLO)", growing))  # fmt: skip
        checks.append((f"naive sent == ok + shed + error ({nv['sent']})", nv["identity"]))
    print()
    for text, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {text}")
    out["checks"] = [{"check": t, "passed": bool(p)} for t, p in checks]
    out["load_after"] = os.getloadavg()
    return out


def _adm(w: dict[str, Any]) -> float | None:
    """p99 of the admitted (ok + error) of a run or window; results before the key: of ok."""
    return w.get("p99_admitted_ms", w["p99_ms"])


def _worst(m: dict[str, Any]) -> float | None:
    """The highest p99 of admitted requests (ok and error, not shed) over the 10-s windows after the first."""
    return max((v for w in m["windows"][1:] if (v := _adm(w)) is not None), default=None)


def _overload_checks(m: dict[str, Any], factor: float, slo_ms: float, cap_goodput: float) -> list[tuple[str, bool]]:
    worst = _worst(m)
    return [
        (f"{factor:g}x: sent == ok + shed + error ({m['sent']} = {m['ok']} + {m['shed']} + {m['error']})",
         m["identity"]),
        (f"{factor:g}x: p99 of admitted (ok + error) in every 10-s window after the first <= SLO {slo_ms:g} ms "
         f"(worst {fmt(worst, '.2f')} ms)", worst is not None and worst <= slo_ms),
        (f"{factor:g}x: goodput {m['goodput']:.1f}/s >= 90% of capacity goodput {cap_goodput:.1f}/s "
         f"({m['goodput'] / cap_goodput:.0%})", m["goodput"] >= 0.9 * cap_goodput),
    ]  # fmt: skip


def probe_ms(run: dict[str, Any]) -> float | None:
    """A run's speed probe: the mean of its before and after readings (either alone where one is missing)."""
    vals = [p["service_ms"] for k in ("probe_before", "probe_after") if (p := run.get(k)) and p.get("service_ms")]
    return sum(vals) / len(vals) if vals else None


def capacity_preprocess_ms(run: dict[str, Any]) -> float | None:
    """The server's mean preprocess ms a request during the capacity step itself (step_speed), or None: the
    refine phase's row at that rate where there is one (its rows come last), else the bisection's step."""
    cap = run.get("capacity", {})
    rate = cap.get("capacity_rate")
    steps = reversed(cap.get("steps", []))
    return next((s.get("server_preprocess_ms") for s in steps if s["offered_rate"] == rate), None)


def _spread(values: list[float]) -> dict[str, Any]:
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "spread": max(abs(v - med) for v in values) / med}


def _busy(m: dict[str, Any]) -> str:
    """Other processes' CPU over a run and the host's steal in its worst 10-s window (results before: '-')."""
    steal = max(m.get("steal_per_window") or [], default=None)
    tries = len(m.get("discarded_tries") or [])
    return f"{fmt(m.get('foreign_cpu'), '.2f')} / {fmt(steal, '.2f')}" + (
        f" ({tries} tries not judged)" if tries else ""
    )


def report(out: dict[str, Any], runs: list[dict[str, Any]], slo_ms: float) -> None:
    """Every run in one table, then the spread over runs and the verdict."""
    rows = []
    for i, r in enumerate(runs, start=1):
        ll, nv, cap = r.get("latencylab"), r.get("naive"), r.get("capacity", {})
        if ll is None:
            rows.append([i, fmt(cap.get("capacity_rate")), "-", "-", "-", "-", "-", "-", "-", "-", "-", "FAIL"])
            continue
        wins = ", ".join(fmt(_adm(w), ".1f") for w in ll["windows"])
        nw = [w["p99_ms"] for w in (nv or {}).get("windows", []) if w["p99_ms"] is not None]
        naive_at = f"at {nv['offered_rate']:.0f}/s: " if nv and "offered_rate" in nv else ""
        naive = f"{naive_at}{nw[0]:.0f} -> {nw[-1]:.0f}" if nw else "-"
        verdict = "PASS" if all(c["passed"] for c in r["checks"]) else "FAIL"
        rows.append([
            i, f"{fmt(cap.get('capacity_rate'))} ({fmt(cap.get('goodput'))})", f"{ll['offered_rate']:.1f}",
            f"{ll['sent']} = {ll['ok']} + {ll['shed']} + {ll['error']}",
            f"{fmt(_adm(ll), '.2f')} ({fmt(ll['p99_ms'], '.2f')})", wins,
            f"{ll['goodput']:.1f} ({r['goodput_fraction']:.0%})", naive,
            f"{r['load_before'][0]:.2f}", _busy(ll),
            fmt(ll.get("learned_margin_ms_at_end"), ".1f"), verdict,
        ])  # fmt: skip
        for e in r.get("latencylab_also", []):
            wins = ", ".join(fmt(_adm(w), ".1f") for w in e["windows"])
            rows.append([
                f"{i} @ {e['factor']:g}x", "", f"{e['offered_rate']:.1f}",
                f"{e['sent']} = {e['ok']} + {e['shed']} + {e['error']}",
                f"{fmt(_adm(e), '.2f')} ({fmt(e['p99_ms'], '.2f')})", wins,
                f"{e['goodput']:.1f} ({e['goodput_fraction']:.0%})", "-", "", _busy(e),
                fmt(e.get("learned_margin_ms_at_end"), ".1f"),
                "PASS" if e["worst_window_p99_ms"] is not None and e["worst_window_p99_ms"] <= slo_ms else "FAIL",
            ])  # fmt: skip
    print()
    heads = ["run", "capacity/s (goodput)", "offered/s", "sent = ok + shed + error", "p99 of admitted (of ok) ms"]
    heads += ["p99 of admitted per 10-s window ms", "goodput/s (of capacity)", "naive p99 first -> last window ms"]
    print(table([*heads, "load avg", "other CPU / steal (worst 10 s)", "learned margin ms (end)", "verdict"], rows))
    caps = [float(r["capacity"]["capacity_rate"]) for r in runs if r.get("capacity", {}).get("capacity_rate")]
    spread = None
    if caps:
        med = statistics.median(caps)
        spread = max(abs(c - med) for c in caps) / med
        out["capacity_spread"] = {"median": med, "min": min(caps), "max": max(caps), "spread": spread}
        print(f"\ncapacity over {len(caps)} runs: median {med:.1f}/s, min-max {min(caps):.1f}-{max(caps):.1f}/s, "
              f"spread +/-{spread:.1%}")  # fmt: skip
    # the capacity in units of the model's light-load service rate (speed_probe): what stays when the host's speed moves
    norm = [(float(r["capacity"]["capacity_rate"]), ms) for r in runs
            if r.get("capacity", {}).get("capacity_rate") and (ms := probe_ms(r)) is not None]  # fmt: skip
    if norm:
        units = [c * ms / 1e3 for c, ms in norm]
        med_u = statistics.median(units)
        spread_u = max(abs(u - med_u) for u in units) / med_u
        probes = [ms for _, ms in norm]
        out["normalised_capacity_spread"] = {"median": med_u, "min": min(units), "max": max(units),
                                             "spread": spread_u, "probe_ms": probes}  # fmt: skip
        print(f"speed probe (preprocess + compute ms a request at a light load) per run: "
              f"{', '.join(f'{ms:.2f}' for ms in probes)}; capacity x probe: "
              f"{', '.join(f'{u:.3f}' for u in units)}, spread +/-{spread_u:.1%}")  # fmt: skip
    # the capacity in units of the host's speed *during the capacity step*, read on the server's own fixed work
    # per request (its preprocess: vision JPEG decode + resize, text tokenising); the light-load probe above
    # misses a host that slows only under sustained load (session 20, docs/benchmarks/serve.md)
    step = [
        (float(r["capacity"]["capacity_rate"]), ms)
        for r in runs
        if r.get("capacity", {}).get("capacity_rate") and (ms := capacity_preprocess_ms(r)) is not None
    ]
    if step:
        units = [c * ms / 1e3 for c, ms in step]
        out["preprocess_normalised_capacity_spread"] = {**_spread(units), "preprocess_ms": [ms for _, ms in step]}
        print(f"server preprocess ms a request during the capacity step per run: "
              f"{', '.join(f'{ms:.3f}' for _, ms in step)}; capacity x that: {', '.join(f'{u:.3f}' for u in units)}, "
              f"spread +/-{out['preprocess_normalised_capacity_spread']['spread']:.1%}")  # fmt: skip
    done = [r for r in runs if r.get("latencylab")]
    if done:
        p99 = [v for r in done if (v := _adm(r["latencylab"])) is not None]
        worst = [r["worst_window_p99_ms"] for r in done if r["worst_window_p99_ms"] is not None]
        for e in (e for r in done for e in r.get("latencylab_also", [])):
            print(
                f"at {e['factor']:g}x: p99 of admitted {fmt(_adm(e), '.2f')} ms, worst window after the first "
                f"{fmt(e['worst_window_p99_ms'], '.2f')} ms, goodput {e['goodput_fraction']:.0%} of capacity"
            )
        gf = [r["goodput_fraction"] for r in done]

        def span(v: list[float]) -> str:  # a run shorter than two windows has no window after the first
            return f"{min(v):.2f}-{max(v):.2f}" if v else "-"

        print(f"p99 of admitted (whole run) {span(p99)} ms; worst 10-s window after the first {span(worst)} ms "
              f"(SLO {slo_ms:g}); goodput {min(gf):.0%}-{max(gf):.0%} of capacity")  # fmt: skip
    per_run = [all(c["passed"] for c in r["checks"]) for r in runs]
    reproducible = spread is not None and (len(caps) < 2 or spread <= 0.10)
    print(f"{'PASS' if all(per_run) else 'FAIL'}  every claim in every run ({sum(per_run)} of {len(runs)} runs pass)")
    if len(runs) > 1:
        print(f"{'PASS' if reproducible else 'FAIL'}  capacities agree within +/-10% "
              f"({'-' if spread is None else f'+/-{spread:.1%}'})")  # fmt: skip
    out["all_passed"] = all(per_run) and (len(runs) < 2 or reproducible)


if __name__ == "__main__":
    sys.exit(main())

"""The report and verdict of benchmarks/serve_vs_peers.py: each server's latency-vs-throughput curve, where its
time went at capacity, the capacity table and latencylab's ratio to the best peer against the 1.3x target
(a lower bound when the peer failed the lowest rate it ran), and, for pooled runs, the interpolated SLO
crossings. Pure printing of result dicts: unit-tested in tests/test_bench_serve_vs_peers.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from typing import Any

from _serving import fmt
from peers.text_servers import SERVERS, spec_of

TARGET_RATIO = 1.3


def capacity_ratio(ours: float, peer: float, peer_lowest: float | None = None) -> tuple[float | None, bool]:
    """(latencylab's capacity over the best peer's, whether that is only a lower bound).

    When only latencylab passed a step, the peer's capacity is somewhere below ``peer_lowest``, the lowest rate
    it was run at: the ratio is known only to exceed ours / peer_lowest (inf if that rate is unknown). None (no
    verdict) when neither passed."""
    if peer > 0:
        return ours / peer, False
    if ours <= 0:
        return None, False
    return (ours / peer_lowest if peer_lowest else float("inf")), True


def show_ratio(ratio: float | None, bound: bool) -> str:
    if ratio is None:
        return "undefined (no server passed a step)"
    return f"> {ratio:.2f}x" if bound else f"{ratio:.2f}x"


def lowest_rate(result: dict[str, Any]) -> float | None:
    """The lowest offered rate among a result's steps."""
    rates = [float(s["offered_rate"]) for s in result.get("steps") or [] if s.get("offered_rate")]
    return min(rates) if rates else None


def print_curve(r: dict[str, Any]) -> None:
    print(f"\n{r['server']}: latency vs throughput (steps sorted by offered rate)")
    print(
        f"  {'offered':>8} {'ok/s':>7} {'p50 ms':>7} {'p99 ms':>8} {'batch':>6} {'fwd ms':>7} {'pad':>5} "
        f"{'srv cpu':>7}  verdict"
    )
    for s in sorted(r["steps"], key=lambda s: s["offered_rate"]):
        pad = s.get("padding_waste")
        print(
            f"  {s['offered_rate']:8.1f} {fmt(s['throughput_ok']):>7} {fmt(s['p50_ms']):>7} {fmt(s['p99_ms']):>8} "
            f"{fmt(s.get('mean_batch'), '.2f'):>6} {fmt(s.get('forward_ms_per_call')):>7} "
            f"{'-' if pad is None else f'{pad:.0%}':>5} {fmt(s.get('server_cpu_cores'), '.2f'):>7}  "
            f"{'PASS' if s['passed'] else 'fail'} ({s['why']})"
        )


def where_time_goes(r: dict[str, Any]) -> str:
    s = r["at_capacity"]
    if s is None:
        return "no passing step"
    parts = [
        f"server CPU {fmt(s.get('server_cpu_cores'), '.2f')} cores, "
        f"generator {fmt(s.get('client_cpu_percent'), '.0f')}%"
    ]
    if s.get("mean_batch") is not None:
        parts.append(f"mean batch {s['mean_batch']:.2f} ({fmt(s.get('batches_per_s'), '.1f')} batches/s)")
    if "forward_ms_per_call" in s:
        parts.append(
            f"forward {s['forward_ms_per_call']:.1f} ms/call, busy {s['forward_busy']:.0%}, "
            f"padding {s.get('padding_waste', 0):.0%}, {fmt(s.get('tokens_per_row'), '.0f')} tokens/row"
        )
        if s.get("max_concurrent_forwards", 1) > 1:
            parts.append(f"up to {s['max_concurrent_forwards']} forwards at once")
    if "server_stage_mean_ms" in s:
        st = s["server_stage_mean_ms"]
        parts.append(
            "stage means ms: "
            + ", ".join(
                f"{k} {st[k]:.1f}"
                for k in ("preprocess", "queue", "batch", "compute", "postprocess", "request")
                if k in st
            )
        )
    if "release_reasons" in s:
        parts.append("released " + ", ".join(f"{k} {v}" for k, v in sorted(s["release_reasons"].items())))
    return "; ".join(parts)


def report(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    versions: dict[str, dict[str, str]],
    skipped: dict[str, str],
) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["server"], []).append(r)
    # Per server: the median capacity over rounds (the round closest to it gives the latencies shown).
    summary: dict[str, dict[str, Any]] = {}
    for name, rs in by.items():
        caps = [r["capacity"] or 0.0 for r in rs]
        med = statistics.median(caps)
        rep = min(rs, key=lambda r: abs((r["capacity"] or 0.0) - med))
        crossings = [r.get("crossing") for r in rs]
        crossing = crossings[0] if len(crossings) == 1 else None  # pooled: one result per server
        summary[name] = {"capacity": med, "rounds": caps, "rep": rep, "crossing": crossing}
    peers = {n: v["capacity"] for n, v in summary.items() if spec_of(n).name != "latencylab"}
    best_peer = max(peers.items(), key=lambda kv: kv[1]) if peers else None
    slo = f"p99<={args.slo_ms:g}ms"
    print(f"\n== capacity at {slo}, Poisson arrivals, {args.step_duration:g} s steps, precision {args.precision:.0%}")
    print(
        f"{'server':<11} {'capacity':>10} {'rounds':>17} {'p50 ms':>7} {'p99 ms':>7} {'vs best peer':>13} {'cos':>8}  "
        "limit / where time goes"
    )
    peer_lowest = lowest_rate(summary[best_peer[0]]["rep"]) if best_peer else None
    for name in [n for n in SERVERS if n in summary] + sorted(n for n in summary if n not in SERVERS):
        v = summary[name]
        s = v["rep"]["at_capacity"] or {}
        ratio, bound = capacity_ratio(v["capacity"], best_peer[1], peer_lowest) if best_peer else (None, False)
        rounds = " ".join(f"{c:.1f}" for c in v["rounds"])
        shown_ratio = "-" if ratio is None else show_ratio(ratio, bound)
        print(
            f"{name:<11} {v['capacity']:>8.1f}/s {rounds:>17} {fmt(s.get('p50_ms')):>7} {fmt(s.get('p99_ms')):>7} "
            f"{shown_ratio:>13} {fmt(v['rep'].get('min_cosine'), '.5f'):>8}  {where_time_goes(v['rep'])}"
        )
    for name, why in skipped.items():
        print(f"{name:<11} {'skipped':>10}  {why}")
    verdict: dict[str, Any] = {"slo": slo, "target_ratio": TARGET_RATIO}
    if "latencylab" in summary and best_peer:
        cap_ratio, bound = capacity_ratio(summary["latencylab"]["capacity"], best_peer[1], peer_lowest)
        ok = cap_ratio is not None and cap_ratio >= TARGET_RATIO  # a lower bound at the target meets it too
        verdict.update({"best_peer": best_peer[0], "ratio": cap_ratio, "ratio_is_lower_bound": bound, "met": ok})
        shown = show_ratio(cap_ratio, bound)
        if bound:
            shown += f" ({best_peer[0]} failed its lowest rate, {fmt(peer_lowest, 'g')}/s)"
        print(
            f"\nlatencylab / best peer ({best_peer[0]}) = {shown} (target >= {TARGET_RATIO}x): "
            f"{'MET' if ok else 'NOT MET'}"
        )
        ours_x, peer_x = summary["latencylab"].get("crossing"), summary[best_peer[0]].get("crossing")
        if ours_x is not None or peer_x is not None:
            # pooled: where each pooled p99 crossed the SLO, interpolated between grid rates (finer than the grid)
            x_ratio = ours_x / peer_x if ours_x is not None and peer_x else None
            verdict.update({"crossing": {"latencylab": ours_x, best_peer[0]: peer_x}, "crossing_ratio": x_ratio})
            print(
                f"interpolated SLO crossing: latencylab {fmt(ours_x)}/s, {best_peer[0]} {fmt(peer_x)}/s, "
                f"ratio {fmt(x_ratio, '.2f')}x (rate where the pooled p99 reaches the SLO, linear between grid rates)"
            )
    print("\n== versions")
    for name, v in versions.items():
        print(f"{name:<11} " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    return {
        "summary": {n: {k: v[k] for k in ("capacity", "rounds", "crossing")} for n, v in summary.items()},
        "verdict": verdict,
    }

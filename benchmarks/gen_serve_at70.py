"""Issue 18's two open serving targets, on their own: TTFT at 70% of the naive server's capacity, and 2x overload.

``benchmarks/gen_serve_vs_peers.py`` runs these as the tail of its capacity searches (one 120-s step at 70%,
5 requests); this driver runs only them, with the same servers, prompts, generator, pinning and objectives
(it imports that script's pieces):

1. at ``--rate`` (0.038/s: 70% of the naive server's measured 0.055/s) the naive server, then latencylab, each
   for ``--duration`` s with the same seed (the same arrival times and prompts), and every request's TTFT side
   by side with its prompt, so that what sets each p99 is visible (a prompt's own prefill, or the wait behind
   another request);
2. latencylab at ``--overload-rate`` (1.35/s: 2x its saved capacity 0.675/s) for ``--overload-duration`` s:
   sent = ok + shed + error, admitted TTFT p99, TPOT p99, and where its time went (its /metrics).

    /tmp/lbench .venv/bin/python benchmarks/gen_serve_at70.py                 # both parts, ~13 min
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_at70.py --only overload # the overload step alone, ~2 min

Output: the report on stdout and ``--out`` (JSON with every request's times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serving import ROOT, machine_load
from gen_serve_vs_peers import (
    Config,
    Step,
    describe,
    drain,
    measure_run,
    prompts_for,
    run_step,
    start_server,
    warm,
)


def run_at(srv: Any, model: str, rate: float, cfg: Config, prompts: list[Any]) -> tuple[Step, list[dict[str, Any]]]:
    """One Poisson step (as ``run_step``) that also keeps every request: intended send time, prompt, TTFT, TPOT."""
    from latencylab.load.token_metrics import token_arrays

    m = measure_run(srv, model, rate, cfg.min_duration_s, cfg, prompts)
    seed, res, rec, wall, cpu, where = m.seed, m.result, m.records, m.wall_s, m.server_cpu_s, m.where
    arr = token_arrays(rec)
    t_first = int(rec.intended_ns.min()) if rec.n else 0
    by_req = {int(i): k for k, i in enumerate(arr.request)}
    rows = []
    for i in range(rec.n):
        k = by_req.get(i)
        p = prompts[int(rec.payload[i])]
        rows.append({
            "at_s": (int(rec.intended_ns[i]) - t_first) / 1e9, "prompt": p.label, "max_tokens": p.max_tokens,
            "outcome": int(rec.outcome[i]),
            "ttft_ms": None if k is None else float(arr.ttft_ns[k]) / 1e6,
            "tpot_ms": None if k is None or np.isnan(arr.tpot_ns[k]) else float(arr.tpot_ns[k]) / 1e6,
            "tokens": None if k is None else int(arr.output_tokens[k]),
        })  # fmt: skip
    tt = np.array([r["ttft_ms"] for r in rows if r["ttft_ms"] is not None], dtype=float)
    tp = np.array([r["tpot_ms"] for r in rows if r["tpot_ms"] is not None], dtype=float)
    q = lambda v, x: float(np.quantile(v, x)) if v.size else None  # noqa: E731
    good = sum(1 for r in rows if r["ttft_ms"] is not None and r["ttft_ms"] <= cfg.ttft_slo_s * 1e3
               and (r["tpot_ms"] or 0.0) <= cfg.tpot_slo_s * 1e3)  # fmt: skip
    s = res.summary
    tok = s.get("tokens") or {}
    st = Step(
        server=srv.name, purpose="at-70%-naive", rate=rate, seed=seed, duration_s=cfg.min_duration_s, wall_s=wall,
        sent=rec.n, ok=int(s["ok"]), shed=int(s["shed"]), error=int(s["error"]), good=good,
        passed=rec.n > 0 and good == rec.n, ttft_p50_ms=q(tt, 0.5), ttft_p99_ms=q(tt, 0.99),
        tpot_p50_ms=q(tp, 0.5), tpot_p99_ms=q(tp, 0.99), output_tokens=int(arr.output_tokens.sum()),
        output_tokens_per_s=float(tok.get("output_tokens_per_s") or 0.0), server_cpu_s=cpu,
        generator_valid=bool(s.get("valid", False)), late_fraction=float(s.get("late_fraction") or 0.0),
        errors=dict(rec.errors), where=where,
    )  # fmt: skip
    return st, rows


def with_server(name: str, cfg: Config, out: Path, fn: Any) -> Any:
    started = start_server(name, cfg, out.parent / "gen-serve-at70-logs" / name)
    if isinstance(started, str):
        raise SystemExit(f"{name}: {started}")
    srv, model = started
    print(f"{name}: up in {srv.startup_s:.1f} s at {srv.url}", flush=True)
    try:
        warm(srv, model)
        drain(srv)
        return fn(srv, model)
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="at70,overload", help="parts, comma-separated: at70, overload")
    ap.add_argument("--rate", type=float, default=0.038, help="req/s: 70%% of the naive server's capacity")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds per server at --rate")
    ap.add_argument("--overload-rate", type=float, default=1.35, help="req/s: 2x latencylab's saved capacity")
    ap.add_argument("--overload-duration", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument(
        "--servers",
        default="naive,latencylab",
        help="at70 part: the servers, naive first (latencylab-bf16p: --prefill-dtype bf16)",
    )
    ap.add_argument("--overload-server", default="latencylab", help="overload part: latencylab or latencylab-bf16p")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gen-serve-at70.json"))
    args = ap.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    out = Path(args.out)
    base = dict(ttft_slo_s=4.0, tpot_slo_s=0.25, max_tokens=args.max_tokens, min_requests=1, max_steps=1,
                timeout_s=60.0, pin=True, quick=False)  # fmt: skip
    prompts = prompts_for(args.max_tokens)
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_at_start": machine_load()}
    print(f"{doc['date']}, load average {doc['load_at_start']}", flush=True)
    if "at70" in parts:
        cfg = Config(min_duration_s=args.duration, max_duration_s=args.duration, **base)  # type: ignore[arg-type]
        at70: dict[str, Any] = {}
        names = [n.strip() for n in args.servers.split(",") if n.strip()]
        for name in names:
            st, rows = with_server(name, cfg, out, lambda srv, model: run_at(srv, model, args.rate, cfg, prompts))
            print(describe(st), flush=True)
            at70[name] = {"step": asdict(st), "requests": rows}
        doc["at70"] = at70
        base_name, others = names[0], names[1:]
        print(f"\nevery request at {args.rate:.3f}/s (same arrivals on every server; TTFT ms):")
        print(f"  {'at s':>7}  {'prompt':<14} " + " ".join(f"{n:>16}" for n in names))
        for reqs in zip(*(at70[n]["requests"] for n in names), strict=False):
            f = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
            cells = " ".join(f"{f(r['ttft_ms']):>16}" for r in reqs)
            print(f"  {reqs[0]['at_s']:7.1f}  {reqs[0]['prompt']:<14} {cells}")
        b = at70[base_name]["step"]
        for name in others:
            a = at70[name]["step"]
            if a["ttft_p99_ms"] and b["ttft_p99_ms"]:
                cut = 1 - a["ttft_p99_ms"] / b["ttft_p99_ms"]
                print(f"* TTFT p99 {name} {a['ttft_p99_ms']:.0f} ms vs {base_name} {b['ttft_p99_ms']:.0f} ms: "
                      f"{cut:.0%} lower (target >= 60%: {'met' if cut >= 0.6 else 'NOT met'}); "
                      f"p50 {a['ttft_p50_ms']:.0f} vs {b['ttft_p50_ms']:.0f} ms")  # fmt: skip
    if "overload" in parts:
        cfg = Config(min_duration_s=args.overload_duration, max_duration_s=args.overload_duration, **base)  # type: ignore[arg-type]
        st = with_server(
            args.overload_server, cfg, out,
            lambda srv, model: run_step(srv, model, args.overload_rate, "overload-2x", cfg, prompts),
        )  # fmt: skip
        print(describe(st), flush=True)
        doc["overload"] = asdict(st)
        print(f"* overload {st.rate:.3f}/s: sent {st.sent} = ok {st.ok} + shed {st.shed} + error {st.error} "
              f"({'holds' if st.accounted else 'BROKEN'}); admitted TTFT p99 {st.ttft_p99_ms:.0f} ms (<= 4 s: "
              f"{'met' if (st.ttft_p99_ms or 1e9) <= 4000 else 'NOT met'}); TPOT p99 {st.tpot_p99_ms:.0f} ms "
              f"(<= 250: {'met' if (st.tpot_p99_ms or 1e9) <= 250 else 'NOT met'}); good {st.good}")  # fmt: skip
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

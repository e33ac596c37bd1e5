"""The SLO guard's fallback ladder under an injected slowdown: stepping down, alarming, stepping back up.

The claim (issue): inject a slowdown into the primary variant and show the ladder stepping down and back
up, with switch times (the seeds' targets: lighter model within 200 ms, quantised model within 100 ms,
cached answer + alarm within 50 ms), and draw the ladder's behaviour (P99 and ladder level over time).

Set-up

* The server runs in this process (``build_state`` + ``lifespan_app`` on uvicorn in a background thread,
  as ``run_server`` does), serving the real built-in variants (``--model vision``: fp32 -> res32 -> int8
  -> cache; ``--model text``: fp32 -> minilm-l3 -> int8 -> cache), each wrapped in ``Slowed``: its
  ``forward`` sleeps an extra delay that this script sets while the server runs.
* Schedule (seconds from the start of the load; ``--delay-ms`` extra per batch forward, default 120):
  fp32 slow from 10 s, the lighter rung slow too from 22 s, the quantised rung too from 34 s (so the
  ladder reaches the cache and raises the alarm), everything restored at 46 s, end at 75 s. ``--quick``
  compresses it (5 / 12 / 19 / 26 / 42 s).
* Load: latencylab's open-loop generator at a constant ``--rate`` (default 50/s) in a separate process
  (spawned: it must not share the server's GIL), its run start reported back on the shared monotonic clock
  so that client and server timelines line up.
* Guard for a ~75-s demo: window 4 s in 0.5-s buckets, dwell 2.5 s, >= 20 samples to step down,
  probes 10% with >= 10 probes to step up (defaults are 10 s / 5 s / 50 / 5% / 30, for a server that
  runs for weeks). SLO p99 <= 50 ms for vision (~2-5 ms when healthy, so the 120 ms injection is an
  unambiguous breach and the restore an unambiguous recovery), 150 ms for text.
* A sampler thread reads the guard every 100 ms: level and the window p99 of the current level.

Output: the transitions (time, from -> to, reason, switch time: decision -> first response at the new
level, against the seeds' targets), client p99 per phase, and the plot ``docs/img/ladder.png``.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/serve_ladder.py [--model vision|text]
        [--rate 50] [--delay-ms 120] [--quick] [--plot docs/img/ladder.png] [--json /tmp/ladder.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

from _serving import ROOT, fmt, machine_load, table, windows

# The seeds' switch-time targets, by the kind of rung switched to.
TARGET_MS = {"lighter": 200.0, "quantized": 100.0, "cache": 50.0}
GUARD = {
    "window_s": 4.0,
    "bucket_s": 0.5,
    "dwell_s": 2.5,
    "min_samples": 20,
    "probe_fraction": 0.1,
    "probe_min_samples": 10,
}


class Slowed:
    """A Variant that delegates to a real one; ``forward`` first sleeps ``extra_s`` (set by the script)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.kind = inner.kind
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.max_batch_size = inner.max_batch_size
        self.extra_s = 0.0

    def preprocess(self, request: Any) -> Any:
        return self.inner.preprocess(request)

    def forward(self, items: Sequence[Any]) -> Any:
        extra = self.extra_s
        if extra > 0:
            time.sleep(extra)
        return self.inner.forward(items)

    def postprocess(self, raw: Any, n: int) -> Any:
        return self.inner.postprocess(raw, n)

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        self.inner.warmup(batch_sizes)


@dataclass(frozen=True)
class Phase:
    at_s: float
    slow: tuple[str, ...]  # variants slowed from at_s on (until the next phase)


def schedule(names: Sequence[str], quick: bool) -> tuple[list[Phase], float]:
    """Phases (cumulative slowdowns down the ladder, then a restore) and the run's duration."""
    p, light, quant = names
    at = (5.0, 12.0, 19.0, 26.0, 42.0) if quick else (10.0, 22.0, 34.0, 46.0, 75.0)
    phases = [
        Phase(0.0, ()),
        Phase(at[0], (p,)),
        Phase(at[1], (p, light)),
        Phase(at[2], (p, light, quant)),
        Phase(at[3], ()),
    ]
    return phases, at[4]


# ----------------------------------------------------------------------------------------------- load child


def _load_child(url: str, model: str, rate: float, duration_s: float, seed: int, conn: Any) -> None:
    """Runs in a spawned process: one open-loop run; sends back (t0 on the monotonic clock, result, records)."""
    from latencylab.load.arrivals import Constant
    from latencylab.load.generator import LoadConfig
    from latencylab.load.payloads import infer_path, text_payloads, vision_payloads
    from latencylab.load.runner import load_test

    payloads = vision_payloads() if model == "vision" else text_payloads()
    t0s: list[int] = []

    def progress(p: dict[str, Any]) -> None:
        # elapsed_s is measured just before this call: now - elapsed bounds the run's t0 from above
        t0s.append(time.perf_counter_ns() - int(p["elapsed_s"] * 1e9))

    conn.send(("ready", None))
    conn.recv()  # go
    cfg = LoadConfig(duration_s=duration_s, timeout_s=30.0, connections=16)
    res, rec = load_test(
        url, infer_path(model), payloads, Constant(rate), cfg, seed=seed, progress=progress, env={"note": "ladder"}
    )
    conn.send(
        (
            "done",
            {
                "t0_ns": min(t0s) if t0s else None,
                "summary": dict(res.summary),
                "intended_ns": rec.intended_ns,
                "done_ns": rec.done_ns,
                "outcome": rec.outcome,
            },
        )
    )
    conn.close()


# ----------------------------------------------------------------------------------------------- server


def start_server(state: Any) -> tuple[Any, threading.Thread, str]:
    """``run_server`` in a background thread: uvicorn on a loopback socket, the app's lifespan on."""
    import uvicorn

    from latencylab.serve.app import bind, lifespan_app

    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(
        lifespan_app(state), log_level="warning", access_log=False, loop="uvloop", http="httptools", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["vision", "text"], default="vision")
    ap.add_argument("--rate", type=float, default=50.0, help="constant arrival rate (req/s)")
    ap.add_argument("--delay-ms", type=float, default=120.0, help="extra forward time injected into a slow rung")
    ap.add_argument("--slo-ms", type=float, help="p99 objective (default: vision 50, text 150)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--quick", action="store_true", help="compressed schedule (42 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=str(ROOT / "docs" / "img" / "ladder.png"), help="PNG path ('' = no plot)")
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the plot from a --json file of an earlier run")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.replot:
        from latencylab.serve.variants import LADDERS

        out = json.loads(Path(args.replot).read_text())
        print(f"wrote {plot(out, [n for n, _ in LADDERS[out['model']]], Path(args.plot))}")
        return 0
    slo_ms = args.slo_ms or (50.0 if args.model == "vision" else 150.0)
    print(f"serve_ladder: model {args.model}, SLO p99 <= {slo_ms:g} ms, {args.rate:g} req/s, {machine_load()}")
    t_wall = time.perf_counter()

    import torch

    from latencylab.serve.app import build_state
    from latencylab.serve.config import ModelConfig, ServerConfig
    from latencylab.serve.variants import LADDERS, build_variants

    torch.set_num_threads(args.threads)
    names = [n for n, _ in LADDERS[args.model]]
    kinds = dict(LADDERS[args.model])
    variants = {v.name: Slowed(v) for v in build_variants(args.model, names, max_batch_size=8)}
    ladder = (*names, "cache")
    mcfg = ModelConfig(name=args.model, ladder=ladder, slo_ms=slo_ms, guard=dict(GUARD))
    state = build_state(ServerConfig(models=(mcfg,)), {args.model: [variants[n] for n in names]})
    svc = state.services[args.model]
    guard = svc.guard
    phases, duration = schedule(names, args.quick)

    server, thread, url = start_server(state)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_load_child, args=(url, args.model, args.rate, duration, args.seed, child), daemon=True)
    proc.start()
    if not parent.poll(120) or parent.recv()[0] != "ready":
        raise RuntimeError("load generator did not start")

    samples: list[tuple[float, int, float | None, bool]] = []
    stop = threading.Event()
    t0_ns = time.perf_counter_ns()  # the schedule's origin; the generator's own t0 is ~20 ms later

    def sampler() -> None:
        while not stop.is_set():
            lvl = guard.level
            samples.append(
                ((time.perf_counter_ns() - t0_ns) / 1e9, lvl, guard.window_quantile(lvl), guard.alarm_active)
            )
            stop.wait(0.1)

    def injector() -> None:
        for ph in phases:
            wait = ph.at_s - (time.perf_counter_ns() - t0_ns) / 1e9
            if wait > 0 and stop.wait(wait):
                return
            for n, v in variants.items():
                v.extra_s = args.delay_ms / 1e3 if n in ph.slow else 0.0
            print(f"  t={ph.at_s:5.1f} s  slow: {', '.join(ph.slow) or 'none (restored)'}")

    threads = [threading.Thread(target=f, daemon=True) for f in (sampler, injector)]
    for t in threads:
        t.start()
    parent.send("go")
    if not parent.poll(duration + 120):
        raise RuntimeError("load generator did not finish")
    _, load = parent.recv()
    stop.set()
    for t in threads:
        t.join(5)
    proc.join(10)
    server.should_exit = True
    thread.join(40)

    # ------------------------------------------------------------------------------------------ report
    shift_s = (load["t0_ns"] - t0_ns) / 1e9 if load["t0_ns"] else 0.0  # client time + shift = schedule time
    trans = guard.transitions
    rows = []
    for t in trans:
        at = t.at_s - t0_ns / 1e9
        kind = "cache" if t.to_name == "cache" else kinds.get(t.to_name, "")
        target = TARGET_MS.get(kind) if t.direction == "down" else None
        sw = None if t.switch_time_s is None else t.switch_time_s * 1e3
        verdict = "-" if target is None or sw is None else ("meets" if sw <= target else "MISSES")
        rows.append(
            [
                f"{at:.2f}", f"{t.from_name} -> {t.to_name}", t.reason, fmt(sw, ".2f"),
                "-" if target is None else f"{target:g} ({kind})", verdict,
            ]
        )  # fmt: skip
    print()
    print(f"load: {load['summary']['sent']} sent, {load['summary']['ok']} ok, {load['summary']['shed']} shed, "
          f"{load['summary']['error']} error; run valid: {load['summary']['valid']}; "
          f"generator t0 at +{shift_s * 1e3:.1f} ms")  # fmt: skip
    print()
    print("transitions (time from the start of the schedule):")
    print(table(["t s", "step", "reason", "switch ms", "target ms", "verdict"], rows))

    # client p99 per phase (by intended send time, on the schedule's clock)
    intended = load["intended_ns"] + int(shift_s * 1e9)
    bounds = [ph.at_s for ph in phases] + [duration + shift_s]
    prow = []
    lat = (load["done_ns"] - load["intended_ns"]) / 1e6
    for i, ph in enumerate(phases):
        m = (intended >= bounds[i] * 1e9) & (intended < bounds[i + 1] * 1e9)
        ok = m & (load["outcome"] == 0)
        v = lat[ok]
        prow.append(
            [
                f"{bounds[i]:g}-{bounds[i + 1]:.0f} s", ", ".join(ph.slow) or "none", int(m.sum()), int(ok.sum()),
                fmt(float(np.quantile(v, 0.5)) if v.size else None, ".2f"),
                fmt(float(np.quantile(v, 0.99)) if v.size else None, ".1f"),
                f"{(v > slo_ms).mean() * 100:.1f}%" if v.size else "-",
            ]
        )  # fmt: skip
    print()
    print("client latency per phase (from intended send; ok requests):")
    print(table(["phase", f"slowed (+{args.delay_ms:g} ms)", "sent", "ok", "p50 ms", "p99 ms", "> SLO"], prow))
    snap = guard.snapshot()
    m = state.metrics.exposition().decode()
    cache_lines = [ln for ln in m.splitlines() if ln.startswith("latencylab_server_cache_total")]
    print()
    print(f"final level {snap['level_name']}, alarm {snap['alarm']}; cache lookups: {'; '.join(cache_lines)}")

    per_s = windows(load["intended_ns"], load["done_ns"], load["outcome"], 1.0)
    out = {
        "schema_version": 1,  # readable by `latencylab report` as a "serve" result (ladder level over time)
        "kind": "serve",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "ladder": list(ladder),
        "model": args.model,
        "slo_ms": slo_ms,
        "rate": args.rate,
        "delay_ms": args.delay_ms,
        "guard": GUARD,
        "phases": [{"at_s": p.at_s, "slow": list(p.slow)} for p in phases],
        "duration_s": duration,
        "transitions": [{**t.to_dict(), "t_s": t.at_s - t0_ns / 1e9} for t in trans],
        "samples": samples,
        "client_per_second": per_s,
        "client_shift_s": shift_s,
        "summary": load["summary"],
        "wall_s": time.perf_counter() - t_wall,
    }
    if args.plot:
        p = plot(out, names, Path(args.plot))
        print(f"wrote {p}")
    print(f"wall time {out['wall_s']:.0f} s; {machine_load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    downs = [t for t in trans if t.direction == "down"]
    ups = [t for t in trans if t.direction == "up"]
    reached = {t.to_name for t in downs}
    back = bool(ups) and guard.level == 0
    ok_all = reached >= set(ladder[1:]) and back
    print(f"{'PASS' if ok_all else 'FAIL'}  ladder stepped down to {sorted(reached)} and back to {guard.level_name}")
    return 0 if ok_all else 1


def _intervals(ts: Sequence[float], flags: Sequence[bool], end: float) -> list[tuple[float, float]]:
    """[(start, stop)] of the runs where ``flags`` is true (sampled at times ``ts``)."""
    out, start = [], None
    for t, f in zip(ts, flags, strict=True):
        if f and start is None:
            start = t
        elif not f and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, end))
    return out


def plot(out: dict[str, Any], names: Sequence[str], path: Path) -> Path:
    """P99 (client per second, guard window) on a log axis; the ladder level as a step line on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ladder = [*names, "cache"]
    slo = out["slo_ms"]
    end = out["duration_s"]
    fig, ax = plt.subplots(figsize=(12, 6.6), dpi=110)
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)  # latency lines above the level line...
    ax.patch.set_visible(False)  # ...without hiding it
    phases = out["phases"]
    for i, ph in enumerate(phases):
        stop = phases[i + 1]["at_s"] if i + 1 < len(phases) else end
        if ph["slow"]:
            ax.axvspan(ph["at_s"], stop, color="#fdae61", alpha=0.13, lw=0)
        for n in ph["slow"]:  # the slowed rung's own row on the ladder axis
            lvl = ladder.index(n)
            ax2.fill_between([ph["at_s"], stop], lvl - 0.28, lvl + 0.28, color="#f46d43", alpha=0.35, lw=0)
        label = ("+" + ", ".join(ph["slow"]) + " slow") if ph["slow"] else ("healthy" if i == 0 else "restored")
        ax.text(ph["at_s"] + 0.3, 2400, label, fontsize=9, va="top", color="#333")
    degraded = next((ph for ph in phases if ph["slow"]), None)
    if degraded is not None:
        ax.text(
            degraded["at_s"] + 0.3,
            1000,
            f"while degraded, {out['guard']['probe_fraction']:.0%} of requests are shadowed on the slowed rung above:\n"
            "a copy runs there for the guard only; the client is answered by the current rung",
            fontsize=8.5,
            va="top",
            color="#b2182b",
        )
    per_s = [w for w in out["client_per_second"] if w["p99_ms"] is not None]
    shift = out["client_shift_s"]
    xs = [w["from_s"] + shift for w in per_s] + [per_s[-1]["to_s"] + shift] if per_s else []
    ys = [w["p99_ms"] for w in per_s] + [per_s[-1]["p99_ms"]] if per_s else []
    ax.step(xs, ys, where="post", lw=1.6, color="#b2182b", label="client p99 per second of intended send (open loop)")
    st = [s[0] for s in out["samples"] if s[2] is not None]
    sq = [s[2] for s in out["samples"] if s[2] is not None]
    ax.plot(st, sq, "-", lw=1.6, color="#2166ac", label="guard: window p99 of the current level (sampled every 100 ms)")
    ax.axhline(slo, color="black", ls="--", lw=1.2, label=f"SLO: p99 <= {slo:g} ms")
    ax.set_yscale("log")
    ax.set_ylim(0.1, 3000)
    ax.set_xlim(0, end)
    ax.set_xlabel("seconds since the start of the load")
    ax.set_ylabel("latency, ms (log scale)")
    ax.grid(True, which="major", alpha=0.3)

    t = [s[0] for s in out["samples"]]
    lv = [s[1] for s in out["samples"]]
    ax2.step(t, lv, where="post", color="#1b7837", lw=2.6, alpha=0.85, label="ladder level (right axis)")
    for a, b in _intervals(t, [bool(s[3]) for s in out["samples"]], end):
        ax2.hlines(len(ladder) - 1 + 0.38, a, b, color="red", lw=5)
        ax2.text(a, len(ladder) - 1 + 0.33, " ALARM", color="red", fontsize=8.5, va="bottom", fontweight="bold")
    ax2.set_ylim(len(ladder) - 0.5, -1.3)  # primary on top (stepping down goes down); rows clear of the SLO line
    ax2.set_yticks(range(len(ladder)))
    ax2.set_yticklabels(ladder)
    ax2.set_ylabel("ladder level", color="#1b7837")
    for tr in out["transitions"]:
        sw = tr["switch_time_s"]
        if sw is not None:
            ax2.annotate(
                f"{sw * 1e3:.1f} ms",
                (tr["t_s"], tr["to_level"]),
                textcoords="offset points",
                xytext=(4, -11 if tr["direction"] == "up" else 4),
                fontsize=8,
                color="#1b7837",
            )
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    extra = [Patch(color="#f46d43", alpha=0.35, label=f"rung slowed by +{out['delay_ms']:g} ms per forward")]
    fig.legend(h1 + h2 + extra, l1 + l2 + [p.get_label() for p in extra], loc="lower center", ncol=3, fontsize=8.5)
    g = out["guard"]
    ax.set_title(
        f"SLO guard ladder: {out['model']} model, {out['rate']:g} req/s open loop, window {g['window_s']:g} s,"
        f" dwell {g['dwell_s']:g} s, probes {g['probe_fraction']:.0%}"
        " (switch time = decision -> first response at the new level)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())

"""Issue 23 on real runs: does a compare gate fire on an unchanged program, and does it catch a real +10%?

Three experiments on a ~1 ms pipeline of fixed CPU work (``benchmarks/_cpu_pipeline.py``: its time moves
with the machine's speed, as a real pipeline's does; ``--workload synthetic`` uses the busy-wait synthetic
workload instead, whose stages wait on the clock and so do not slow down with the machine), every one
through the ``latencylab`` command line exactly as a CI job would run it:

1. **A/A taken apart in time** (files): 2P runs of ``latencylab profile --runs R`` of one configuration,
   one every ``--gap`` seconds; pair i is profile i against profile i + P, so the two sides of a pair
   are minutes apart. ``latencylab compare a.json b.json --fail-if ...`` on each pair; a pair "fires"
   when the exit status is 1. For contrast, the same pairs cut to their first run only (one run a side,
   as before issue 23) are compared with ``--strict``, which fires on within-run evidence alone.
2. **A/B interleaved, +10% on one stage**: P runs of ``latencylab compare --run A B --rounds K``, B's
   forward stage given 10% more work (``forward_scale=1.10``; synthetic: forward 800us -> 880us); a run
   "catches" the change when the exit status is 1.
3. **A/A interleaved**: the same with A against A: the recommended gate's own false-positive rate.

    flock /tmp/latencylab-bench.lock .venv/bin/python benchmarks/compare_runs.py --pairs 20 --out /tmp/cr

Prints one line per pair and a summary; ``--out DIR`` keeps the files and writes ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BASE = "preprocess:normal(100us,10us);forward:lognormal({fwd},0.1);postprocess:constant(100us)"
GATES = ("p50>+5%", "forward:p50>+5%")
CLI = [sys.executable, "-m", "latencylab"]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "HF_HUB_OFFLINE": "1"}
WORKLOAD = "cpu"


def source(slower: bool) -> list[str]:
    if WORKLOAD == "cpu":
        return ["--pipeline", "_cpu_pipeline:make", "--param", f"forward_scale={1.10 if slower else 1.0}"]
    return ["--workload", "synthetic", "--param", f"stages={BASE.format(fwd='880us' if slower else '800us')}"]


def spec(slower: bool) -> str:
    return " ".join(shlex.quote(w) for w in source(slower))


def gate_args() -> list[str]:
    return [x for g in GATES for x in ("--fail-if", g)]


def profile(path: Path, runs: int, iterations: int) -> None:
    cmd = [*CLI, "profile", *source(False)]
    cmd += ["--iterations", str(iterations), "--runs", str(runs), "--quiet", "--json", str(path)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)


def compare(args: list[str], json_path: Path) -> tuple[int, dict[str, Any]]:
    cmd = [*CLI, "compare", *args, *gate_args(), "--json", str(json_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode not in (0, 1):
        raise SystemExit(f"compare failed ({p.returncode}): {p.stderr.strip()}")
    return p.returncode, json.loads(json_path.read_text())


def first_run_only(src: Path, dst: Path) -> None:
    """The result cut to its first run: what one `latencylab profile` (one run) would have recorded."""
    from latencylab.results import ProfileResult

    r = ProfileResult.from_dict(json.loads(src.read_text()))
    sl = r.run_slices()[0]
    d = r.to_dict()
    d["iteration_start_ns"] = d["iteration_start_ns"][sl]
    for s in d["stages"]:
        s["samples_ns"] = s["samples_ns"][sl]
    d.pop("iteration_run", None)
    d.pop("runs", None)
    d.pop("iteration_meta", None)
    dst.write_text(json.dumps(d))


def describe(doc: dict[str, Any]) -> str:
    parts = []
    for g in doc["gates"]:
        state = "FIRED" if g["fired"] else ("undecided" if g.get("undecided") else "pass")
        rel = g["delta"]["baseline"] and g["delta"]["candidate"] / g["delta"]["baseline"] - 1
        parts.append(f"{g['gate']['text']} {state} ({rel * 100:+.1f}%)")
    c = doc.get("canary")
    if c:
        parts.append(f"canary {c['slower'] * 100:+.1f}%")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5, help="runs per profile in experiment 1")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds in experiments 2 and 3")
    ap.add_argument("--ab-iterations", type=int, default=100, help="iterations per run in experiments 2 and 3")
    ap.add_argument("--gap", type=float, default=5.0, help="seconds between the profiles of experiment 1")
    ap.add_argument("--only", choices=["aa-files", "ab", "aa-interleaved"], action="append")
    ap.add_argument("--workload", choices=["cpu", "synthetic"], default="cpu")
    ap.add_argument("--out", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()
    global WORKLOAD
    WORKLOAD = args.workload
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="compare_runs-"))
    out.mkdir(parents=True, exist_ok=True)
    todo = args.only or ["aa-files", "ab", "aa-interleaved"]
    summary: dict[str, Any] = {"pairs": args.pairs, "gates": GATES, "config": vars(args)}
    t_all = time.time()

    if "aa-files" in todo:
        t = time.time()
        paths = [out / f"aa_{i:02d}.json" for i in range(2 * args.pairs)]
        stamps = []
        for i, path in enumerate(paths):
            if i:
                time.sleep(args.gap)
            stamps.append(time.time())
            profile(path, args.runs, args.iterations)
        fired = strict_old = 0
        undecided = 0
        canaries = []
        for i in range(args.pairs):
            a, b = paths[i], paths[i + args.pairs]
            rc, doc = compare([str(a), str(b)], out / f"aa_cmp_{i:02d}.json")
            fired += rc == 1
            first_run_only(a, out / f"aa1_{i:02d}a.json")
            first_run_only(b, out / f"aa1_{i:02d}b.json")
            rc1, doc1 = compare(
                [str(out / f"aa1_{i:02d}a.json"), str(out / f"aa1_{i:02d}b.json"), "--strict"],
                out / f"aa1_cmp_{i:02d}.json",
            )
            strict_old += rc1 == 1
            undecided += any(g.get("undecided") for g in doc["gates"])
            if doc.get("canary"):
                canaries.append(doc["canary"]["slower"])
            apart = stamps[i + args.pairs] - stamps[i]
            line = f"A/A files pair {i:2d} ({apart:4.0f} s apart): exit {rc}: {describe(doc)}"
            print(f"{line} | one run a side, --strict: exit {rc1}: {describe(doc1)}", flush=True)
        summary["aa_files"] = {
            "fired": fired,
            "undecided_pairs": undecided,
            "one_run_strict_fired": strict_old,
            "canary_slower": canaries,
            "seconds": round(time.time() - t, 1),
        }
        print(f"A/A files: gate fired in {fired}/{args.pairs} pairs ({undecided} with an undecided gate); one run a "
              f"side with --strict: {strict_old}/{args.pairs}  ({time.time() - t:.0f} s)", flush=True)  # fmt: skip

    for name, slower in (("ab", True), ("aa-interleaved", False)):
        if name not in todo:
            continue
        t = time.time()
        hits = 0
        rels = []
        for i in range(args.pairs):
            run = ["--run", spec(False), spec(slower), "--rounds", str(args.rounds)]
            run += ["--iterations", str(args.ab_iterations), "--seed", str(i)]
            rc, doc = compare(run, out / f"{name}_cmp_{i:02d}.json")
            hits += rc == 1
            rels.append([g["delta"]["candidate"] / g["delta"]["baseline"] - 1 for g in doc["gates"]])
            print(f"{name} {i:2d}: exit {rc}: {describe(doc)}", flush=True)
        summary[name] = {"fired": hits, "rel": rels, "seconds": round(time.time() - t, 1)}
        print(f"{name}: gate fired in {hits}/{args.pairs}  ({time.time() - t:.0f} s)", flush=True)

    summary["seconds"] = round(time.time() - t_all, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"total {summary['seconds']:.0f} s; files in {out}")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

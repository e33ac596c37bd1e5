"""Distributed optimisation builds (issue 20): the same search in one process and with its builds on a local
2-node Ray cluster, side by side in one run.

* A local cluster (``ray.cluster_utils.Cluster``, started here, torn down after) of ``--nodes`` nodes with
  ``--threads`` Ray CPUs each is up during both runs (its idle daemons load both alike).
* One process: ``latencylab optimize --json`` in a subprocess (builds, fidelity runs and timing rounds in one
  process, ``--threads`` threads).
* Ray: ``latencylab optimize --ray ADDRESS --workers NODES --json`` in a subprocess: one build worker a node
  (the ONNX Runtime family's builds); the driver (on the head node) builds what cannot be shipped (the torch
  family, in a thread, beside the workers) and runs the timing rounds, as in one process.
* Each search is its own process: in one process the second search would inherit the first's torch.compile
  state (dynamo's recompile limit, reached on the text workload's varied lengths, then runs it eagerly).
* The build phase: one process, from the search's start to its first timing round (``summary.phases.build_s``,
  every build and fidelity run, serial); Ray, the cluster's start-up (workers placed, each opening the
  workload) plus the span from the first hand-out to the last report, plus the opening of every candidate
  on the timing node (``summary.distributed``); the sum of the build times shows the work done.
* The choice and its p50 ratios per input set, and whether every candidate's status and fidelity are equal.

No time cap (``time_budget_s=None``) in either run, so both build every candidate. On this 2-vCPU machine the
one-process search leaves one vCPU idle during its builds (1 thread); the Ray run uses both: the ceiling is 2x
on the build phase, less on the wall time (the timing rounds stay serial on one node).

    /tmp/lbench .venv/bin/python benchmarks/optimize_ray.py [--workload text] [--only A,B] [--rounds 5]
    .venv/bin/python benchmarks/optimize_ray.py --simulate RESULT.json   # the build phase at 1..100 workers

``--simulate`` replays the hand-out of ``search_on_ray`` (``_build_all``: candidates in the search's order, each to
the first free worker, a candidate whose shared intermediate is being made held back until it is made) with the
one-process run's build times from a ``--json`` file of this script, at 1, 2, 4, 10 and 100 workers, plus the
driver's own builds (the torch family) beside them: what the build phase would be with that many nodes, shipping
left out (at 1 GB/s, the text search's ~1 GB adds about a second).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def fidelity_table(doc: dict[str, Any]) -> dict[str, Any]:
    return {c["name"]: (c["status"], c["fidelity"]) for c in doc["candidates"]}


def brief(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    ch = s.get("chosen") or {}
    by_set = s.get("speedup_by_set") or {}
    sets = ", ".join(f"{k} {v:.2f}x" for k, v in by_set.items() if v)
    return f"chosen {ch.get('name')} ({sets or 'no speed-up'})"


def optimize(args: argparse.Namespace, out: Path, *extra: str) -> tuple[dict[str, Any], float]:
    """``latencylab optimize`` in a subprocess: (its result, its wall time)."""
    cmd = [sys.executable, "-m", "latencylab", "optimize", "--workload", args.workload, "--rounds", str(args.rounds),
           "--threads", str(args.threads), "--time-budget", "1e9", "--quiet", "--json", str(out), *extra]  # fmt: skip
    if args.only:
        cmd += ["--only", args.only]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text()), time.perf_counter() - t0


def simulate(doc: dict[str, Any], workers: int) -> float:
    """The build phase (s) of ``doc``'s candidates (the one-process run's build times) with ``workers`` Ray
    workers, the torch family in the driver beside them: ``search_on_ray``'s hand-out, event by event."""
    built = [c for c in doc["candidates"] if c.get("build_s") is not None]
    here = sum(c["build_s"] for c in built if c["backend"] != "onnxruntime")
    queue = [c for c in built if c["backend"] == "onnxruntime"]
    idle, now, end = workers, 0.0, 0.0
    running: list[tuple[float, str]] = []  # (end time, shared intermediate)
    making: set[str] = set()
    while queue or running:
        while idle:
            c = next((c for c in queue if not _shares(c) or _shares(c) not in making), None)
            if c is None:
                break
            queue.remove(c)
            idle -= 1
            running.append((now + c["build_s"], _shares(c)))
            if _shares(c):
                making.add(_shares(c))
        running.sort()
        now, key = running.pop(0)
        making.discard(key)
        idle += 1
        end = now
    return max(end, here)


def _shares(c: dict[str, Any]) -> str:
    q = (c.get("params") or {}).get("quantization") or {}
    fb = q.get("fallback") or {}
    if fb.get("policy") != "sensitivity":
        return ""
    return json.dumps([(c.get("params") or {}).get("source"), q.get("per_channel"), q.get("weight_type")])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", metavar="RESULT.json", help="replay the hand-out over 1..100 workers (see above)")
    ap.add_argument("--workload", default="text", choices=["text", "vision"])
    ap.add_argument("--only", default="", help="comma-separated candidates (default: the whole search)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.simulate:
        doc = json.loads(Path(args.simulate).read_text())["one"]
        total = sum(c["build_s"] or 0 for c in doc["candidates"])
        base = (doc["summary"].get("phases") or {}).get("build_s") or total
        print(f"one process: build phase {base:.1f} s; sum of builds {total:.1f} s")
        for w in (1, 2, 4, 10, 100):
            t = simulate(doc, w)
            print(f"{w:4d} workers + the driver: {t:6.1f} s ({base / t:.2f}x), start-up and opening left out")
        return 0
    print(f"# optimize_ray: {args.workload}, {args.threads} thread(s), {args.nodes} nodes; "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}", flush=True)  # fmt: skip
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": args.threads})
    for _ in range(args.nodes - 1):
        c.add_node(num_cpus=args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="optimize-ray-"))
    try:
        one, one_wall = optimize(args, tmp / "one.json")
        ray_doc, ray_wall = optimize(args, tmp / "ray.json", "--ray", c.address, "--workers", str(args.nodes))
    finally:
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    d = ray_doc["summary"]["distributed"]
    one_build = one["summary"]["phases"]["build_s"]
    builds_one = sum(c["build_s"] or 0.0 for c in one["candidates"])
    ray_build = ray_doc["summary"]["phases"]["build_s"]
    n_built = len(d["candidates"])
    print(f"candidates built: one process {sum(1 for c in one['candidates'] if c['build_s'] is not None)}, "
          f"ray {n_built} ({len(d['built_here'])} of them in the driver)")  # fmt: skip
    print(f"one process: build phase {one_build:.1f} s (sum of builds {builds_one:.1f} s), wall {one_wall:.1f} s")
    print(f"ray, {args.nodes} nodes: build phase {ray_build:.1f} s: the workers' start-up {d['startup_s']:.1f} s, then "
          f"their builds {d['build_phase_s']:.1f} s beside the driver's {d['local_phase_s']:.1f} s (together "
          f"{d['builds_wall_s']:.1f} s; sum of builds {d['builds_sum_s']:.1f} s), opening here "
          f"{d['open_phase_s']:.1f} s; wall {ray_wall:.1f} s; shipped {d['shipped_bytes'] / 1e6:.1f} MB")  # fmt: skip
    print(f"build phase ratio (one process / ray): {one_build / ray_build:.2f}x; wall ratio {one_wall / ray_wall:.2f}x")
    per_worker: dict[int, float] = {}
    for p in d["candidates"].values():
        w = -1 if p["worker"] is None else p["worker"]
        per_worker[w] = per_worker.get(w, 0.0) + p["build_s"]
    each = ", ".join(f"{w}: {t:.1f}" for w, t in sorted(per_worker.items()))
    print(f"build seconds per worker (-1: the driver): {each}")
    print(f"one process: {brief(one)}\nray:         {brief(ray_doc)}")
    same = fidelity_table(one) == fidelity_table(ray_doc)
    print(f"every candidate's status and fidelity equal: {same}")
    if not same:
        a, b = fidelity_table(one), fidelity_table(ray_doc)
        for k in a:
            if a[k] != b.get(k):
                print(f"  differs: {k}: {a[k]} vs {b.get(k)}")
    rows = []
    for c in one["candidates"]:
        r = next(x for x in ray_doc["candidates"] if x["name"] == c["name"])
        rows.append((c["name"], c["status"], c.get("build_s"), r.get("build_s"), c.get("speedup_p50"),
                     r.get("speedup_p50")))  # fmt: skip
    print(f"{'candidate':44s} {'status':15s} {'build 1p':>9s} {'build ray':>9s} {'x 1p':>7s} {'x ray':>7s}")
    for name, st, b1, b2, s1, s2 in rows:

        def f(v: Any, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        print(f"{name:44s} {st:15s} {f(b1, '9.1f')} {f(b2, '9.1f')} {f(s1, '7.2f')} {f(s2, '7.2f')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"one": one, "ray": ray_doc, "one_wall_s": one_wall,
                                               "ray_wall_s": ray_wall}, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

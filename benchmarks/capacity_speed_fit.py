"""Read saved capacity searches back in the host's speed: where does each run's shed curve cross its allowance?

``serve_overload.py --json`` keeps every refine-phase rate of its capacity search (docs/metrics.md, "Capacity": the
refine phase) with the shed-or-failed fraction pooled over its chunks, the requests sent and the server's
preprocess ms a request while it ran. On a VM whose speed moves 10-30% within minutes, two runs of the same code
measure different machines; this script separates the two readings:

* ``capacity``: what the search found (the highest grid rate inside both allowances on the isotonic fit);
* ``linear``: the rate where a straight line fitted to the grid's shed fractions (weighted by requests sent)
  crosses the shed allowance (5% text, 1% otherwise): every grid rate informs it, not only the ones near the
  crossing;
* ``work``: the same crossing with the load in the server's work units, rate x preprocess seconds a request (CPU
  seconds of preprocess a second, a quantity the host's speed does not scale), and that crossing divided by the
  run's median preprocess seconds (its capacity at its own speed) and by the median over every run given
  (``at ref``: each run's crossing at one reference speed, the spread a steady host would show).

    .venv/bin/python benchmarks/capacity_speed_fit.py benchmarks/results/serve-overload-text-s2[23]-[0-9].json

No measurement: it reads the JSON files only, and prints a row per run and the spread (max |x - median| / median)
of each reading.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return max(abs(v - med) for v in values) / med


def fit_crossing(x: np.ndarray, frac: np.ndarray, weight: np.ndarray, allow: float) -> float:
    """Where the weighted least-squares line of ``frac`` on ``x`` reaches ``allow`` (nan if it does not rise)."""
    a = np.vstack([np.ones_like(x), x]).T
    w = np.diag(weight)
    beta = np.linalg.solve(a.T @ w @ a, a.T @ w @ frac)
    return float((allow - beta[0]) / beta[1]) if beta[1] > 0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="serve_overload.py --json documents")
    args = ap.parse_args()
    rows = []
    for path in args.files:
        doc = json.loads(path.read_text())
        for run in doc.get("runs", []):
            cap = run["capacity"]
            steps = [s for s in cap["steps"] if s.get("phase") == "refine"]
            if len(steps) < 2:
                print(f"{path.name}: no refine phase, skipped")
                continue
            allow = 0.05 if doc.get("model", run.get("model")) == "text" or "text" in path.name else 0.01
            rate = np.array([s["offered_rate"] for s in steps])
            sent = np.array([s["sent"] for s in steps], dtype=float)
            frac = np.array([s["failed_fraction"] for s in steps])
            pre_s = np.array([s["server_preprocess_ms"] for s in steps]) / 1e3
            linear = fit_crossing(rate, frac, sent, allow)
            work = fit_crossing(rate * pre_s, frac, sent, allow)
            rows.append((path.name, cap["capacity_rate"], linear, work, float(np.median(pre_s))))
    if not rows:
        raise SystemExit("no run with a refine phase")
    ref = statistics.median(r[4] for r in rows)
    print(f"{'run':<36} {'capacity/s':>10} {'linear/s':>9} {'work CPU-s/s':>13} {'own speed/s':>12} {'at ref/s':>9}")
    for name, c, lin, work, pre in rows:
        print(f"{name:<36} {c:>10.1f} {lin:>9.1f} {work:>13.4f} {work / pre:>12.1f} {work / ref:>9.1f}")
    print(f"reference speed: median preprocess {ref * 1e3:.3f} ms a request over {len(rows)} runs")
    for i, label in ((1, "capacity"), (2, "linear"), (3, "work (= at ref)")):
        print(f"spread of {label}: +/-{100 * spread([r[i] for r in rows]):.1f}%")


if __name__ == "__main__":
    main()

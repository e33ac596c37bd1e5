"""Part 2's scheduling on pytest-xdist workers: a test file per worker at a time, the longest files first.

``--dist loadfile`` hands out whole files (a module's fixtures, a model load or a server, are built once), in
order of their number of tests. That order put the suite's longest file (the generative serving benchmark's
``--quick`` run, ~55 s, one slow test among a few fast ones) near the end, where it ran alone while the other
worker had nothing left. Here each free worker takes the file expected to take longest (the classic
longest-processing-time rule: the last file to start is a short one), from ``tests/durations.json``: the
seconds each file took in part 2 (set-up, call and tear-down of its tests), written by a run with
``LATENCYLAB_RECORD_DURATIONS=tests/durations.json``. A file missing from the table counts as the table's median;
a stale table only costs order, never a test.

``GROUPS`` puts files that must not run at the same time on one worker, one after the other: the two local Ray
clusters (each module starts its own and counts CPUs on it).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("durations.json")
GROUPS = {
    "tests/test_scaleout_ray.py": "tests/test_scaleout_*.py (local Ray clusters, one at a time)",
    "tests/test_scaleout_serve.py": "tests/test_scaleout_*.py (local Ray clusters, one at a time)",
    "tests/test_scaleout_optimize.py": "tests/test_scaleout_*.py (local Ray clusters, one at a time)",
    "tests/test_scaleout_autoscale.py": "tests/test_scaleout_*.py (local Ray clusters, one at a time)",
    "tests/test_scaleout_gen.py": "tests/test_scaleout_*.py (local Ray clusters, one at a time)",
}


def scope_of(nodeid: str) -> str:
    """The work unit of a test: its file, or its file's group."""
    path = nodeid.split("::", 1)[0]
    return GROUPS.get(path, path)


def load_table(path: Path = TABLE) -> dict[str, float]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}


def expected_s(scope: str, table: dict[str, float]) -> float:
    """Seconds a work unit is expected to take: the sum of its files' entries (the median for a missing one)."""
    default = statistics.median(table.values()) if table else 1.0
    files = [f for f, g in GROUPS.items() if g == scope] or [scope]
    return sum(table.get(f, default) for f in files)


def longest_first(scopes: list[str], table: dict[str, float]) -> str:
    """The scope to hand out next: the longest expected (ties: the earliest in collection order)."""
    return max(scopes, key=lambda s: (expected_s(s, table), -scopes.index(s)))


def make_scheduler(config: Any, log: Any, table: dict[str, float] | None = None) -> Any:
    """A ``LoadFileScheduling`` whose work units are ``scope_of`` and whose next unit is ``longest_first``
    (expected times from ``table``, by default ``tests/durations.json``)."""
    from xdist.scheduler import LoadFileScheduling

    if table is None:
        table = load_table()

    class LongestFileFirst(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            nxt = longest_first(list(self.workqueue), table)
            self.workqueue.move_to_end(nxt, last=False)
            super()._assign_work_unit(node)

    return LongestFileFirst(config, log)


class DurationRecorder:
    """Sums each file's set-up, call and tear-down seconds over the run (on the xdist controller, which receives
    every worker's reports) and writes them as ``tests/durations.json`` does at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[nodeid.split("::", 1)[0]] += duration

    def write(self) -> None:
        old = load_table(self.path)
        old.update({k: round(v, 2) for k, v in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n")

"""The ``profile`` result: raw per-stage samples of one ``latencylab profile`` run.

Raw samples (integer nanoseconds) are the source of truth; every percentile,
share and warning is derived from them (see ``analysis``, which computes the
summary the writer stores beside them: :func:`latencylab.analysis.save_profile`).
Each result carries the environment fingerprint it was measured in and ``schema_version``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab.errors import LatencyLabError
from latencylab.results.base import utc_now, write_json
from latencylab.results.registry import kind_version

SCHEMA_VERSION = kind_version("profile")


@dataclass(frozen=True, slots=True)
class StageSeries:
    """Per-iteration durations of one stage, in integer nanoseconds, in run order."""

    name: str
    kind: str
    samples_ns: tuple[int, ...]

    def array(self) -> npt.NDArray[np.int64]:
        return np.asarray(self.samples_ns, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """One ``latencylab profile`` run.

    ``iteration_start_ns[i]`` is when timed iteration i began, relative to the
    first timed iteration (host clock). End-to-end latency of iteration i is
    the sum of its stage durations, which equals last-mark minus first-mark.

    ``iteration_meta`` (optional, columnar) holds per-iteration facts a
    pipeline reports through ``Pipeline.probe``: key -> one JSON value per
    iteration (e.g. "shape" -> [[1, 23], [1, 9], ...], "compiles" -> [0, 1, ...]).
    Empty when the pipeline has no probe; files without it read as empty.

    ``runs`` (optional) describes each run of a multi-run profile (``profile
    --runs N``): ``run``, ``n``, ``start_s``, ``wall_time_s``, ``stop_reason``,
    ``position`` (its place in an interleaved round); ``iteration_run[i]`` is
    the run iteration i belongs to. Both are empty for a single run (and in
    files written before runs existed): every iteration is in run 0.
    """

    workload: str
    stages: tuple[StageSeries, ...]
    iteration_start_ns: tuple[int, ...]
    clock: str
    config: Mapping[str, Any]
    pipeline: Mapping[str, Any]
    env: Mapping[str, Any]
    stop_reason: str
    warmup_iterations: int
    wall_time_s: float
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "profile"
    iteration_meta: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    iteration_run: tuple[int, ...] = ()
    runs: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.stages:
            raise LatencyLabError("a profile result needs at least one stage")
        n = len(self.stages[0].samples_ns)
        if any(len(s.samples_ns) != n for s in self.stages) or len(self.iteration_start_ns) != n:
            raise LatencyLabError("every stage must have one sample per iteration")
        if any(len(v) != n for v in self.iteration_meta.values()):
            raise LatencyLabError("every iteration_meta column must have one value per iteration")
        if self.iteration_run:
            if len(self.iteration_run) != n:
                raise LatencyLabError("iteration_run must have one run index per iteration")
            if list(self.iteration_run) != sorted(self.iteration_run) or self.iteration_run[0] != 0:
                raise LatencyLabError("iteration_run must count runs up from 0 in iteration order")
            if self.runs and len(self.runs) != self.iteration_run[-1] + 1:
                raise LatencyLabError("runs must describe every run in iteration_run")

    @property
    def n_runs(self) -> int:
        return self.iteration_run[-1] + 1 if self.iteration_run else 1

    def run_index(self) -> npt.NDArray[np.int64]:
        """The run of every iteration (all 0 for a single run)."""
        if not self.iteration_run:
            return np.zeros(self.n, dtype=np.int64)
        return np.asarray(self.iteration_run, dtype=np.int64)

    def run_slices(self) -> list[slice]:
        """Iteration ranges of each run, in run order (runs are contiguous)."""
        idx = self.run_index()
        edges = np.flatnonzero(np.diff(idx)) + 1
        bounds = [0, *edges.tolist(), self.n]
        return [slice(a, b) for a, b in itertools.pairwise(bounds)]

    @property
    def n(self) -> int:
        return len(self.iteration_start_ns)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def stage(self, name: str) -> StageSeries:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def end_to_end_ns(self) -> npt.NDArray[np.int64]:
        return np.sum([s.array() for s in self.stages], axis=0).astype(np.int64)

    def to_dict(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON document; ``summary`` (derived figures, computed by the writer, e.g.
        :func:`latencylab.analysis.save_profile`) is stored after the header when given."""
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "created_at": self.created_at,
            "workload": self.workload,
        }
        if summary is not None:
            d["summary"] = dict(summary)
        d.update(
            {
                "clock": self.clock,
                "stop_reason": self.stop_reason,
                "warmup_iterations": self.warmup_iterations,
                "wall_time_s": self.wall_time_s,
                "config": dict(self.config),
                "pipeline": dict(self.pipeline),
                "env": dict(self.env),
                "iteration_start_ns": list(self.iteration_start_ns),
                "stages": [{"name": s.name, "kind": s.kind, "samples_ns": list(s.samples_ns)} for s in self.stages],
            }
        )
        if self.iteration_meta:
            d["iteration_meta"] = {k: list(v) for k, v in self.iteration_meta.items()}
        if self.iteration_run:
            d["iteration_run"] = list(self.iteration_run)
        if self.runs:
            d["runs"] = [dict(r) for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileResult:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise LatencyLabError(f"unsupported schema_version {version!r} (this latencylab reads {SCHEMA_VERSION})")
        if d.get("kind") != "profile":
            raise LatencyLabError(f"not a profile result (kind={d.get('kind')!r})")
        try:
            return cls(
                workload=str(d["workload"]),
                stages=tuple(
                    StageSeries(str(s["name"]), str(s["kind"]), tuple(int(v) for v in s["samples_ns"]))
                    for s in d["stages"]
                ),
                iteration_start_ns=tuple(int(v) for v in d["iteration_start_ns"]),
                clock=str(d["clock"]),
                config=dict(d["config"]),
                pipeline=dict(d["pipeline"]),
                env=dict(d["env"]),
                stop_reason=str(d["stop_reason"]),
                warmup_iterations=int(d["warmup_iterations"]),
                wall_time_s=float(d["wall_time_s"]),
                created_at=str(d["created_at"]),
                schema_version=int(version),
                iteration_meta={str(k): tuple(v) for k, v in (d.get("iteration_meta") or {}).items()},
                iteration_run=tuple(int(v) for v in d.get("iteration_run") or ()),
                runs=tuple(dict(r) for r in d.get("runs") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LatencyLabError(f"malformed profile result: {exc!r}") from exc

    def save(self, path: str | Path, summary: Mapping[str, Any] | None = None) -> Path:
        """Write the result (atomically), with ``summary`` when the writer computed one."""
        return write_json(path, self.to_dict(summary))


def load_result(path: str | Path) -> ProfileResult:
    """Read a profile result file (one-line errors for bad files)."""
    from latencylab.results.reader import read_document

    return ProfileResult.from_dict(read_document(path))

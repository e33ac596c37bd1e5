"""Distributed optimisation builds on Ray: ``latencylab optimize --ray [ADDRESS] --workers N``.

The search (:mod:`latencylab.optimize.search`) has two phases. Builds and fidelity runs are independent per
candidate; latency must be measured on one machine, in interleaved rounds. So:

1. The driver (the process that ran the command; its node is the **timing node**, whose fingerprint the
   result's ``env`` is) makes the FP32 ONNX export once and sends its work directory's files to N
   :class:`Builder` actors (``--threads`` Ray CPUs each, spread over the nodes). Each builder opens the same
   workload (:func:`latencylab.optimize.lab.make_context`) and the same candidate list.
2. Only candidates whose build leaves a file that opens without building again go to the builders: the ONNX
   Runtime family (:data:`SHIPPED_BACKENDS`). The others (the torch family: a module in memory; torch.compile,
   whose compilation happens at the first calls and must happen where it is timed; OpenVINO and TVM, not yet
   made shippable) are built and run on their held-out sets in the driver, in a thread, while the builders
   work: each is built once, where it is timed, as in one process.
   The driver hands the shipped candidates out in the search's order, one to each idle builder, except that
   candidates sharing an intermediate (``Candidate.shares``: a sensitivity ranking) go one at a time, so that
   the later ones find it made (forwarded with their hand-out) instead of making it again at the same time.
   A builder builds it, runs every held-out set (the outputs the fidelity check needs), and sends back the
   outputs, its build time and the files the build added to its work directory (the ORT family's quantised
   and fused graphs, sensitivity rankings: content-addressed by what they were made from). The driver keeps
   those files and forwards them to the other builders with their next candidate, so a later build that
   needs the same intermediate (a sensitivity ranking) reuses it when it is already there. The search's time
   cap applies at hand-out, as in one process. Skip reasons are asked on the driver (the target).
3. The driver checks that every builder ran the same held-out inputs (a digest), computes fidelity against
   the baseline's outputs (:func:`latencylab.optimize.search.judge`), and opens every candidate that passed
   the build here: ``cand.build(ctx)`` finds the shipped files under the same names and only opens them
   (a torch candidate, whose build ships no file, is rebuilt: its open time says so). It runs each opened
   candidate on the first feed of every set and compares with the builder's outputs; where they differ by
   more than :data:`CHECK_TOL` (another ISA, another kernel), the fidelity is measured again here on every
   feed, and the result says so.
4. The timing rounds and the choice are the one-process search's (:func:`latencylab.optimize.search.finish`).

``summary["distributed"]`` names the builders' nodes, the timing node, each candidate's builder, build and
open times and shipped bytes, and the build phase's wall time against the sum of the build times.
``ray`` is imported here only, and only when the cluster is opened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.search import (
    TIME_CAP_REASON,
    Budget,
    CandidateResult,
    ProgressFn,
    Ran,
    SearchResult,
    failed_build,
    finish,
    held_out_sets,
    judge,
    result_of,
    run_sets,
)
from latencylab.optimize.types import BuildContext, Candidate, Feed, Runner
from latencylab.timing import now_ns

INSTALL_HINT = "distributed builds need Ray: pip install 'latencylab[ray]'"
CHECK_TOL = 1e-4  # max |difference| / max(1, max |output|) between the builder's and the timing node's outputs
FP32_NAME = "fp32.onnx"
# Backends whose build writes a content-addressed file under the work directory that ``build`` opens again
# without redoing the work (the ONNX Runtime family's graphs and sensitivity rankings).
SHIPPED_BACKENDS = frozenset({"onnxruntime"})


@dataclass
class LocalBuilds:
    """The candidates built in the driver (not shippable): runner, outputs, build time, stats or the error."""

    built: dict[str, tuple[Runner, Ran, float, dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, CandidateResult] = field(default_factory=dict)  # failed (or found not applicable) here
    skipped: list[str] = field(default_factory=list)  # cut by the time cap
    span_s: float = 0.0


def _build_local(
    ctx: BuildContext,
    cands: list[Candidate],
    sets: dict[str, list[Feed]],
    exempt: set[str],
    over_time: Any,
    out: LocalBuilds,
    progress: ProgressFn | None,
) -> None:
    """Build and run each candidate here, in order (a thread of the driver while the builders work)."""
    t0 = time.perf_counter()
    for cand in cands:
        if cand.name not in exempt and over_time():
            out.skipped.append(cand.name)
            continue
        if progress is not None:
            progress(f"building {cand.name} here", len(out.built), len(cands))
        t = time.perf_counter_ns()
        try:
            runner = cand.build(ctx)
            ran = run_sets(runner, sets)
        except Exception as exc:  # reported as the search reports a failed build
            out.errors[cand.name] = failed_build(cand, exc)
            continue
        stats = dict(getattr(runner, "stats", {}) or {})
        out.built[cand.name] = (runner, ran, (time.perf_counter_ns() - t) / 1e9, stats)
    out.span_s = time.perf_counter() - t0


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise LatencyLabError(INSTALL_HINT) from exc
    return ray


def feeds_digest(sets: dict[str, list[Feed]]) -> str:
    """sha256 over every held-out feed of every set (set names, then each feed's names, dtypes, shapes, bytes)."""
    import hashlib

    from latencylab.optimize.families.onnxruntime.common import _feeds_digest

    joined = "|".join(f"{name}:{_feeds_digest(feeds)}" for name, feeds in sets.items())
    return hashlib.sha256(joined.encode()).hexdigest()


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime_ns) of every plain file under ``root`` (hidden temporaries left out)."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("latencylab-sens-")]
        for f in filenames:
            if f.startswith("."):
                continue
            p = Path(dirpath) / f
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def added_files(root: Path, before: dict[str, tuple[int, int]]) -> dict[str, bytes]:
    """The files under ``root`` that are new or changed since ``before``, as bytes."""
    out = {}
    for rel, sig in snapshot(root).items():
        if before.get(rel) != sig:
            with contextlib.suppress(FileNotFoundError):
                out[rel] = (root / rel).read_bytes()
    return out


def write_missing(root: Path, files: dict[str, bytes]) -> list[str]:
    """Write each file under ``root`` unless it is there already; refuses a path that leaves ``root``."""
    wrote = []
    base = root.resolve()
    for rel, data in files.items():
        dst = (root / rel).resolve()
        if base not in dst.parents:
            raise LatencyLabError(f"a shipped file {rel!r} would land outside the work directory")
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part")
        tmp.write_bytes(data)
        os.replace(tmp, dst)
        wrote.append(rel)
    return wrote


@dataclass(frozen=True, slots=True)
class BuildReport:
    """What a builder sends back for one candidate (picklable)."""

    name: str
    worker: int
    host: str
    node_id: str
    error: str | None  # the failed build's reason (the search's wording), None when it built and ran
    ran: Ran | None
    build_s: float
    stats: dict[str, Any]
    files: dict[str, bytes]
    started_unix: float
    ended_unix: float
    feeds_digest: str


def _node_id() -> str:
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    return ""


class Builder:
    """One build worker: a Ray actor in a cluster (``ray.remote`` applied by the driver), a plain object in
    a test. It holds the workload and the candidate list, built once, and a work directory of its own."""

    def __init__(self, index: int, cfg: Any, budget: str, files: dict[str, bytes]) -> None:
        from latencylab.optimize.lab import lab_candidates, make_context, prepare_context

        self.index = index
        self.workdir = Path(tempfile.mkdtemp(prefix="latencylab-build-"))
        self.ctx = make_context(cfg, self.workdir)
        prepare_context(self.ctx, cfg, Budget.parse(budget))
        self.receive(files)
        self.cands = {c.name: c for c in lab_candidates(self.ctx, cfg)}
        self.sets = held_out_sets(self.ctx)
        self.digest = feeds_digest(self.sets)

    def where(self) -> dict[str, Any]:
        return {"worker": self.index, "host": socket.gethostname(), "node_id": _node_id(), "pid": os.getpid()}

    def receive(self, files: dict[str, Any]) -> None:
        """Files from the driver (bytes, or Ray object refs to bytes); the FP32 export becomes the context's."""
        if any(not isinstance(v, bytes) for v in files.values()):
            ray = _ray()
            keys = list(files)
            files = dict(zip(keys, ray.get([files[k] for k in keys]), strict=True))
        write_missing(self.workdir, files)
        if (self.workdir / FP32_NAME).exists():
            self.ctx.cache["fp32_onnx"] = self.workdir / FP32_NAME

    def build(self, name: str, files: dict[str, Any]) -> BuildReport:
        self.receive(files)
        cand = self.cands[name]
        before = snapshot(self.workdir)
        started = time.time()
        t0 = time.perf_counter_ns()
        ran: Ran | None = None
        error = None
        stats: dict[str, Any] = {}
        try:
            runner = cand.build(self.ctx)
            try:
                ran = run_sets(runner, self.sets)
                stats = dict(getattr(runner, "stats", {}) or {})
            finally:
                with contextlib.suppress(Exception):
                    runner.close()
        except Exception as exc:  # reported as the search reports a failed build; the search goes on
            error = failed_build(cand, exc).reason
        build_s = (time.perf_counter_ns() - t0) / 1e9
        w = self.where()
        return BuildReport(
            name, self.index, w["host"], w["node_id"], error, ran, build_s, stats, added_files(self.workdir, before),
            started, time.time(), self.digest,
        )  # fmt: skip

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class BuildCluster:
    """N :class:`Builder` actors on a Ray cluster (``address``: ``ray://...``, HOST:PORT, or None for
    RAY_ADDRESS / a local instance); opened by :meth:`open`, the actors killed by :meth:`close`."""

    workers: int
    address: str | None = None
    cpus: float = 1.0
    place_timeout_s: float = 120.0
    actors: list[Any] = field(default_factory=list)
    where: list[dict[str, Any]] = field(default_factory=list)
    _started_ray: bool = False

    def open(self, cfg: Any, budget: str, files: dict[str, bytes]) -> None:
        """Start the workers (nothing when they are started already)."""
        if self.actors:
            return
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address or None, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            self._started_ray = True
        shared = {k: ray.put(v) for k, v in files.items()}
        cls = ray.remote(num_cpus=self.cpus, scheduling_strategy="SPREAD", max_restarts=0)(Builder)
        self.actors = [cls.remote(i, cfg, budget, shared) for i in range(self.workers)]
        try:  # placed, the workload opened; a cluster without the CPUs would wait forever
            self.where = ray.get([a.where.remote() for a in self.actors], timeout=self.place_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise LatencyLabError(
                f"Ray could not start {self.workers} build workers ({self.cpus:g} CPUs each) within "
                f"{self.place_timeout_s:g} s: the cluster has fewer free CPUs than --workers x --threads"
            ) from None
        except ray.exceptions.RayActorError as exc:
            self.close()
            raise LatencyLabError(f"a build worker failed to start: {str(exc).strip().splitlines()[-1]}") from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            ray = _ray()
            for a in self.actors:
                with contextlib.suppress(Exception):
                    ray.get(a.close.remote(), timeout=10)
                with contextlib.suppress(Exception):
                    ray.kill(a)
            self.actors = []
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False


def _check(runner: Runner, sets: dict[str, list[Feed]], ran: Ran) -> float:
    """The largest relative difference between ``runner``'s outputs here and the builder's, on the first
    feed of every set."""
    worst = 0.0
    for name, feeds in sets.items():
        here = np.asarray(runner.run(feeds[0]), dtype=np.float32)
        there = ran[name][0][: len(here)]
        if here.shape != there.shape or not np.isfinite(here).all():
            return float("inf")
        scale = max(1.0, float(np.abs(there).max(initial=0.0)))
        worst = max(worst, float(np.abs(here - there).max(initial=0.0)) / scale)
    return worst


def search_on_ray(
    ctx: BuildContext,
    cfg: Any,
    candidates: Sequence[Candidate],
    budget: Budget,
    keep: Sequence[str] = (),
    progress: ProgressFn | None = None,
    cluster: BuildCluster | None = None,
) -> tuple[SearchResult, dict[str, Any]]:
    """The search of :func:`latencylab.optimize.search.search` with its build phase on Ray (module
    docstring); returns the result and ``summary["distributed"]``."""
    from latencylab.clock import PerfCounterClock

    clk = PerfCounterClock()
    t_start = now_ns(clk)
    if not candidates:
        raise LatencyLabError("no candidates to search")
    sets = held_out_sets(ctx)
    digest = feeds_digest(sets)
    labels = ctx.adapter.labels()
    total = len(candidates) + 1
    results: dict[str, CandidateResult] = {}
    todo: list[Candidate] = []
    for i, cand in enumerate(candidates):
        why = cand.skip_reason(ctx)  # asked here: the timing node is the target
        if why:
            if i == 0:
                raise LatencyLabError(f"the baseline {cand.name} cannot run here: {why}")
            results[cand.name] = result_of(cand, "skipped", why)
        else:
            todo.append(cand)
    baseline = candidates[0].name
    exempt = {baseline, *keep}
    shipped = [c for c in todo if c.backend in SHIPPED_BACKENDS]
    here = [c for c in todo if c.backend not in SHIPPED_BACKENDS]

    def over_time() -> bool:
        return cfg.time_budget_s is not None and (now_ns(clk) - t_start) / 1e9 > cfg.time_budget_s

    if shipped:
        with contextlib.suppress(Exception):  # a model that cannot export: its ONNX candidates fail as they would
            ctx.fp32_onnx()
    local = LocalBuilds()
    worker = threading.Thread(
        target=_build_local, args=(ctx, here, sets, exempt, over_time, local, progress), daemon=True
    )
    cl = cluster or BuildCluster(int(cfg.workers), cfg.ray or None, cpus=float(cfg.threads))
    startup_s = build_phase_s = 0.0
    reports: dict[str, BuildReport] = {}
    timing = {"host": socket.gethostname(), "node_id": _node_id(), "pid": os.getpid()}
    t_builds = time.perf_counter()
    worker.start()
    try:
        if shipped:
            if progress is not None:
                progress(f"starting {cl.workers} build workers on Ray", 0, total)
            t_up = time.perf_counter()
            cl.open(cfg, budget.text, added_files(ctx.workdir, {}))
            startup_s = time.perf_counter() - t_up
            timing["node_id"] = _node_id()  # while Ray is up (closed before the timing rounds when started here)
            try:
                reports, build_phase_s = _build_all(ctx, cl, shipped, exempt, over_time, results, progress)
            finally:
                cl.close()
    finally:
        worker.join()
    builds_s = time.perf_counter() - t_builds
    for name in local.skipped:
        results[name] = result_of(next(c for c in here if c.name == name), "skipped", TIME_CAP_REASON)
    t_open = now_ns(clk)
    runners, opened = _open_here(ctx, candidates, todo, reports, local, results, digest, budget, labels, sets,
                                 progress)  # fmt: skip
    open_phase_s = (now_ns(clk) - t_open) / 1e9
    res = finish(ctx, candidates, budget, results, runners, cfg.rounds, cfg.per_round, 2, progress, clk, t_start)
    first = min((r.started_unix for r in reports.values()), default=0.0)
    per: dict[str, dict[str, Any]] = {}
    for name, rep in reports.items():
        per[name] = {
            "worker": rep.worker, "host": rep.host, "node_id": rep.node_id, "build_s": rep.build_s,
            "started_s": rep.started_unix - first, "ended_s": rep.ended_unix - first,
            "shipped_bytes": sum(len(b) for b in rep.files.values()), **opened.get(name, {}),
        }  # fmt: skip
    for name, (_, _, build_s, _) in local.built.items():
        per[name] = {"worker": None, "host": timing["host"], "node_id": timing["node_id"], "build_s": build_s,
                     "shipped_bytes": 0, **opened.get(name, {})}  # fmt: skip
    dist = {
        "workers": cl.workers,
        "address": cfg.ray or None,
        "builders": cl.where,
        "timing_node": timing,
        "startup_s": startup_s,  # the workers placed and their workload opened
        "build_phase_s": build_phase_s,  # the first hand-out -> the last report
        "local_phase_s": local.span_s,  # the driver's own builds (not shippable), beside the workers'
        "builds_wall_s": builds_s,  # start-up, the workers' builds and the driver's, as they overlapped
        "builds_sum_s": sum(p["build_s"] for p in per.values()),
        "built_here": sorted(local.built),
        "open_phase_s": open_phase_s,
        "shipped_bytes": sum(p["shipped_bytes"] for p in per.values()),
        "candidates": per,
    }
    return res, dist


def _build_all(
    ctx: BuildContext,
    cl: BuildCluster,
    todo: list[Candidate],
    exempt: set[str],
    over_time: Any,
    results: dict[str, CandidateResult],
    progress: ProgressFn | None,
) -> tuple[dict[str, BuildReport], float]:
    """Hand the candidates out, one per idle builder, in order; collect the reports and the files."""
    ray = _ray()
    queue = list(todo)
    idle = list(range(len(cl.actors)))
    has: list[set[str]] = [set(snapshot(ctx.workdir)) for _ in cl.actors]
    store: dict[str, Any] = {}  # relative path -> object ref of the bytes
    in_flight: dict[Any, tuple[int, Candidate]] = {}
    reports: dict[str, BuildReport] = {}
    lost: dict[str, list[str]] = {}  # candidate -> the deaths of the workers that had it
    making: set[str] = set()  # shared intermediates (Candidate.shares) a build in flight is making
    t0 = time.perf_counter()
    while queue or in_flight:
        while idle and queue:
            # the first in order whose shared intermediate no build in flight is making (else it would be made twice)
            cand = next((c for c in queue if not c.shares or c.shares not in making), None)
            if cand is None:
                break
            queue.remove(cand)
            if cand.name not in exempt and over_time():
                results[cand.name] = result_of(cand, "skipped", TIME_CAP_REASON)
                continue
            w = idle.pop(0)
            missing = {rel: ref for rel, ref in store.items() if rel not in has[w]}
            has[w] |= set(missing)
            in_flight[cl.actors[w].build.remote(cand.name, missing)] = (w, cand)
            if cand.shares:
                making.add(cand.shares)
        if not in_flight:
            break
        done, _ = ray.wait(list(in_flight), num_returns=1)
        w, cand = in_flight.pop(done[0])
        making.discard(cand.shares)
        try:
            rep: BuildReport = ray.get(done[0])
        except ray.exceptions.RayActorError as exc:  # the worker died (its node, or the build crashed it)
            lost.setdefault(cand.name, []).append(f"build worker {w} died: {_last_line(exc)}")
            if len(lost[cand.name]) < 2 and (idle or in_flight):
                queue.insert(0, cand)  # once more, on another worker; a second death is the candidate's
            else:
                results[cand.name] = result_of(cand, "failed", "; ".join(lost[cand.name])[:300])
            if not idle and not in_flight and queue:
                raise LatencyLabError("every build worker died; the search cannot go on") from None
            continue
        idle.append(w)
        for rel, data in rep.files.items():
            if rel not in store:
                store[rel] = ray.put(data)
        has[w] |= set(rep.files)
        write_missing(ctx.workdir, rep.files)
        if cand.name in lost:
            rep.stats["retried_after"] = lost[cand.name]
        reports[cand.name] = rep
        if progress is not None:
            progress(f"built {cand.name} on worker {w}", len(reports), len(todo))
    return reports, time.perf_counter() - t0


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


def _open_here(
    ctx: BuildContext,
    candidates: Sequence[Candidate],
    todo: list[Candidate],
    reports: dict[str, BuildReport],
    local: LocalBuilds,
    results: dict[str, CandidateResult],
    digest: str,
    budget: Budget,
    labels: np.ndarray | None,
    sets: dict[str, list[Feed]],
    progress: ProgressFn | None,
) -> tuple[dict[str, Runner], dict[str, dict[str, Any]]]:
    """Fidelity against the baseline's outputs; every shipped candidate opened on this (the timing) node and
    checked against its builder's outputs; the driver's own builds as they are."""
    baseline = candidates[0].name
    if baseline in local.errors or (baseline in results and results[baseline].status == "failed"):
        why = local.errors.get(baseline) or results[baseline].reason
        raise LatencyLabError(f"the baseline {baseline} failed: {why}")
    for r in reports.values():
        if r.feeds_digest != digest:
            raise LatencyLabError(
                f"build worker {r.worker} ({r.host}) ran other held-out inputs than this node: the workload "
                "must be the same files and versions on every node"
            )
    runners: dict[str, Runner] = {}
    opened: dict[str, dict[str, Any]] = {}
    reference: dict[str, np.ndarray] = {}
    for cand in todo:
        is_base = cand.name == baseline
        if cand.name in local.errors:
            results[cand.name] = local.errors[cand.name]
            continue
        if cand.name in local.built:
            runner, ran, build_s, stats = local.built[cand.name]
            info: dict[str, Any] = {"open_s": 0.0, "fidelity_on": "timing node (built here)"}
        else:
            rep = reports.get(cand.name)
            if rep is None:
                continue  # cut by the time cap or its worker died: already in results
            if rep.error is not None or rep.ran is None:
                if is_base:
                    raise LatencyLabError(f"the baseline {baseline} failed: {rep.error}")
                results[cand.name] = result_of(cand, "failed", rep.error or "build failed")
                continue
            if progress is not None:
                progress(f"opening {cand.name} here", len(runners), len(candidates) + 1)
            t0 = time.perf_counter()
            try:
                runner = cand.build(ctx)
                gap = _check(runner, sets, rep.ran)
            except Exception as exc:  # built there, not here: reported as a failed build, with where
                why = failed_build(cand, exc).reason
                results[cand.name] = result_of(cand, "failed", f"opening on the timing node: {why}")
                continue
            info = {"open_s": time.perf_counter() - t0, "check_max_rel": gap, "fidelity_on": "builder"}
            ran, build_s = rep.ran, rep.build_s
            if not gap <= CHECK_TOL:  # another kernel there: the timed runner's own outputs decide
                ran = run_sets(runner, sets)
                info["fidelity_on"] = "timing node (builder's outputs differ)"
            stats = {**rep.stats, "built_on": {"worker": rep.worker, "host": rep.host}}
        if is_base:
            reference = {name: outs for name, (outs, _, _) in ran.items()}
        results[cand.name] = judge(cand, is_base, ran, build_s, stats, reference, budget, labels)
        opened[cand.name] = info
        if results[cand.name].status == "failed":
            with contextlib.suppress(Exception):
                runner.close()
        else:
            runners[cand.name] = runner
    return runners, opened

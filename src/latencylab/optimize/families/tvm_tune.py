"""MetaSchedule tuning within a time budget (``--tune-time``), its database cached per machine fingerprint.

A tuned candidate (``tvm-relax-tuned``) tunes each static shape's Relax module with MetaSchedule
(``tune_relax``: replay-trace sampling, random cost model) in **one** call, paid its task initialisation once,
and stops it when the budget is spent (:func:`run_to_budget`: the child's process group is terminated; the JSON
database keeps every record committed before, :func:`repair_database` drops a line cut by the stop). It then
compiles with the records (``compile_library``). The module is legalised and fused under the recipe's fusion
depth before the tasks are extracted, so the tasks are the kernels that depth leaves. The database lives under
``$LATENCYLAB_CACHE/tvm-tune/<machine>/<model + shape + depth>``: ``<machine>`` hashes the CPU (model, flags,
cores), TVM's version and the target, so records measured on one CPU are never applied on another, and a
second search on the same machine finds ``done.json`` there and reuses the records without tuning again (its
``tune_time_s`` is the first search's, reported with ``tuning_reused: true``).

The tuning runs in a child process (``python -m latencylab.optimize.families.tvm_tune``): MetaSchedule's
runner is a process pool, and a crash in it must fail one candidate, not the search. (Sessions 12-27 saw one
on every try: ``tvm::ffi::ToJSONGraph`` segfaults. The cause was apache-tvm-ffi 0.1.15, which breaks TVM
0.27.0.post1's JSON serialisation of any TIR module; the ``tvm`` extra now pins ``<0.1.15``, and the machine
key includes tvm-ffi's version, so a crash marker left by the broken pair is not read by the fixed one.) The
candidates are compiled in the child itself (:func:`in_process_builder`); the runner is one process, made once,
with a long timeout (:data:`RUN_TIMEOUT_S`): its first call imports TVM, ~30 s on 2 vCPUs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.timing import now_ns

# The most trials the one tune_relax call is asked for: the budget stops it long before (~0.5 s a trial here)
MAX_TRIALS = 1 << 16
# Random sampling of each task's design space. The evolutionary search (MetaSchedule's default) spent its first
# 5 minutes on MiniLM's 27 tasks building initial populations before a single trial (measured here, session 28);
# with the random cost model its selection is random anyway, and without xgboost there is no other model.
STRATEGY = "replay-trace"
# Candidates per task per scheduler iteration. The task scheduler first gives every task one iteration: with
# MetaSchedule's 64 (or 16), MiniLM's 27 tasks need 1728 (432) trials before the last is tried, far past what a
# few minutes build on 2 vCPUs (~2.4 s a trial here); with 4, 108.
PER_ITER = 4
RUN_TIMEOUT_S = 60.0  # per candidate, the runner worker's first TVM import included
WORKLOADS = "database_workload.json"  # MetaSchedule's JSONDatabase files in a work_dir
RECORDS = "database_tuning_record.json"
STARTED = "tuning.started"  # the child writes it just before the tune_relax call: the budget counts from there
POLL_S = 0.25
STOP_WAIT_S = 15.0  # after SIGTERM to the child's process group, before SIGKILL
DONE = "done.json"
CRASHED = "crashed.json"  # beside a machine's databases: MetaSchedule was killed by a signal there
GRACE_S = 300.0  # the child's start (imports, task extraction) and its first record (the pools' TVM import)


def cache_root() -> Path:
    env = os.environ.get("LATENCYLAB_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "latencylab") / "tvm-tune"


def _ffi_version() -> str:
    try:
        from importlib.metadata import version

        return version("apache-tvm-ffi")
    except Exception:  # not installed as a distribution (a source build): the TVM version alone
        return ""


def machine_key(target: str, tvm_version: str) -> str:
    """The CPU (model name, flags, cores), TVM's and tvm-ffi's versions and the target, hashed: whose
    measurements these are."""
    from latencylab.roofline.theory import read_cpu

    cpu = read_cpu()
    blob = {"cpu": cpu.model_name, "flags": sorted(cpu.flags), "cores": cpu.cores, "tvm": tvm_version, "t": target}
    ffi = _ffi_version()
    if ffi:
        blob["ffi"] = ffi
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def database_dir(machine: str, model_digest: str, shape_tag: str) -> Path:
    return cache_root() / machine / f"{model_digest}-{shape_tag}"


def reused(work_dir: Path) -> dict[str, Any] | None:
    """The record of a finished tuning in ``work_dir`` (its spend, trials), or None."""
    done = work_dir / DONE
    if not done.is_file():
        return None
    return dict(json.loads(done.read_text()))


def known_crash(machine: str) -> str | None:
    """The skip reason when MetaSchedule was killed by a signal on this machine before (its marker file)."""
    marker = cache_root() / machine / CRASHED
    if not marker.is_file():
        return None
    why = str(json.loads(marker.read_text()).get("reason", "crashed"))
    return f"{why} (on this machine before; delete {marker} to try again)"


def tune(
    onnx_path: Path,
    work_dir: Path,
    tune_time_s: float,
    threads: int,
    fuse_max_depth: int | None = None,
    fast_math: bool = False,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """Tune ``onnx_path`` (static shapes, fused to ``fuse_max_depth``, with ``fast_math``) for ``tune_time_s``
    seconds into ``work_dir`` unless a finished database is there; returns ``tune_time_s`` (spent, or spent by the
    search that made it), ``trials`` (the records in the database), ``stopped_at_budget``, ``tuning_reused``. A
    failed or crashed tuning raises a LatencyLabError with the child's last line."""
    got = reused(work_dir)
    if got is not None:
        return {**got, "tuning_reused": True, "database": str(work_dir)}
    clk = clock or PerfCounterClock()
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / STARTED).unlink(missing_ok=True)
    depth = "0" if fuse_max_depth is None else str(int(fuse_max_depth))
    cmd = [sys.executable, "-m", __name__, str(onnx_path), str(work_dir), str(int(threads)), depth,
           "1" if fast_math else "0"]  # fmt: skip
    t0 = now_ns(clk)
    code, stopped, log = run_to_budget(cmd, work_dir, tune_time_s, GRACE_S, clk)
    spent = (now_ns(clk) - t0) / 1e9
    if code != 0 and not stopped:
        lines = [ln for ln in log.splitlines() if ln.strip()]
        why = "signal 11 (segfault)" if code in (-11, 139) else f"exit status {code}"
        last = next((ln.strip() for ln in reversed(lines) if "Error" in ln or "tvm::" in ln), "")
        msg = f"MetaSchedule tuning crashed: {why}{': ' + last if last else ''}"
        if code < 0 or code > 128:  # killed by a signal not ours: it will be again, on this machine
            (work_dir.parent / CRASHED).write_text(json.dumps({"reason": msg}))
        raise LatencyLabError(msg)
    trials = repair_database(work_dir)
    if trials == 0:
        raise LatencyLabError(
            f"MetaSchedule measured no candidate within {tune_time_s:g} s + {GRACE_S:.0f} s of start-up"
        )
    record = {"tune_time_s": round(spent, 3), "trials": trials, "budget_s": float(tune_time_s),
              "stopped_at_budget": stopped}  # fmt: skip
    (work_dir / DONE).write_text(json.dumps(record))
    return {**record, "tuning_reused": False, "database": str(work_dir)}


def records(work_dir: Path) -> int:
    """Complete lines in the tuning-record file (a line still being written is not counted)."""
    path = work_dir / RECORDS
    if not path.is_file():
        return 0
    return path.read_bytes().count(b"\n")


def run_to_budget(
    cmd: list[str], work_dir: Path, budget_s: float, grace_s: float, clock: Clock
) -> tuple[int, bool, str]:
    """Run ``cmd`` in its own process group until it exits, or until ``budget_s`` seconds after it wrote
    ``work_dir/STARTED`` with at least one record committed, then stop the group (SIGTERM, then SIGKILL after
    :data:`STOP_WAIT_S`; MetaSchedule's builder and runner pools are in it). A child that never gets there is
    stopped ``budget_s + grace_s`` after its start. Returns (exit status, stopped by us, its output)."""
    out_path = work_dir / "tuning.log"
    with out_path.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = now_ns(clock)
        began: int | None = None
        stopped = False
        while proc.poll() is None:
            t = now_ns(clock)
            if began is None and (work_dir / STARTED).is_file():
                began = t
            spent = (t - began) / 1e9 if began is not None else 0.0
            if (spent >= budget_s and records(work_dir) > 0) or (t - t0) / 1e9 >= budget_s + grace_s:
                _stop(proc)
                stopped = True
                break
            time.sleep(POLL_S)
    return int(proc.returncode), stopped, out_path.read_text(errors="replace")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's process group, SIGKILL to whatever of it is left after :data:`STOP_WAIT_S`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_WAIT_S)
    with contextlib.suppress(ProcessLookupError):  # the child, or a pool worker that outlived it
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def repair_database(work_dir: Path) -> int:
    """Drop what a stop in mid-write left in ``work_dir``'s JSON database: a workload or record line that does
    not parse (and any after it), and a record whose workload index is not a workload kept; the lines kept are
    written back as they were. Returns the records kept."""
    workloads = _json_lines(work_dir / WORKLOADS)
    kept = [(raw, r) for raw, r in _json_lines(work_dir / RECORDS)
            if isinstance(r, list) and r and isinstance(r[0], int) and 0 <= r[0] < len(workloads)]  # fmt: skip
    for path, rows in ((work_dir / WORKLOADS, workloads), (work_dir / RECORDS, kept)):
        if path.is_file():
            path.write_text("".join(raw + "\n" for raw, _ in rows))
    return len(kept)


def _json_lines(path: Path) -> list[tuple[str, Any]]:
    """(line, parsed) for each line of ``path`` up to the first that does not parse (a line cut by the stop:
    nothing is written after it)."""
    if not path.is_file():
        return []
    rows: list[tuple[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append((line, json.loads(line)))
        except ValueError:
            break
    return rows


def fused_for_tuning(mod: Any, target: Any, fuse_max_depth: int | None = None) -> Any:
    """``mod`` legalised and fused as the tuned compile (``tvm_build.tuned_pipeline``) prepares it before it
    applies the database (library dispatch, ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FoldConstant``,
    ``FuseOps``, ``FuseTIR`` at opt level 3, under the recipe's fusion depth), so that the tasks tuned are the
    fused kernels it looks up. MetaSchedule extracts tasks from the TIR functions already in a module: on the
    imported graph (Relax operators, not yet TIR) it found one, a scalar ``maximum``, and 384 trials (session
    28's first MiniLM run) tuned nothing that mattered."""
    import tvm

    from latencylab.optimize.families.tvm_build import fuse_passes, pass_config

    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(fuse_max_depth)):
        return tvm.transform.Sequential(fuse_passes(target))(mod)


def in_process_builder() -> Any:
    """A MetaSchedule builder that compiles each candidate in this process (MetaSchedule's default build and
    export functions). ``LocalBuilder`` starts a new worker process for every ``build`` call, one per
    scheduler iteration ("because of a known memory leak"), and that worker imports TVM first: ~40 s of every
    iteration here (session 29's log: 4 candidates of a tiny kernel took 39-47 s to build). The tuning runs in
    a child process of its own already, so a crash in a build still fails one candidate of the search only."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs: list[Any]) -> list[Any]:
            results = []
            for inp in build_inputs:
                try:
                    results.append(BuilderResult(default_export(default_build(inp.mod, inp.target, None)), None))
                except Exception as exc:  # a candidate that does not compile: MetaSchedule skips it
                    results.append(BuilderResult(None, f"in-process build: {type(exc).__name__}: {exc}"))
            return results

    return InProcessBuilder()


def _child(
    onnx_path: str, work_dir: str, threads: int, fuse_max_depth: int | None, fast_math: bool = False
) -> dict[str, Any]:
    """One MetaSchedule ``tune_relax`` call into ``work_dir``'s JSON database, asked for :data:`MAX_TRIALS`:
    the parent stops it when the budget is spent (:func:`run_to_budget`)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from latencylab.optimize.families.tvm_build import host_target, relax_module

    # TVM's own SIGSEGV handler symbolises a backtrace of its 100-MB library (~30 s here): a crash is reported
    # by its signal alone (the parent names it)
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    host = host_target()
    target = tvm.target.Target({**dict(host.export()), "num-cores": max(1, threads)})
    mod = fused_for_tuning(relax_module(Path(onnx_path), fast_math), target, fuse_max_depth)
    builder = in_process_builder()
    runner = ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)  # its pool is made once: one TVM import
    Path(work_dir, STARTED).write_text("")
    ms.relax_integration.tune_relax(mod, {}, target, work_dir, max_trials_global=MAX_TRIALS,
                                    num_trials_per_iter=PER_ITER, cost_model="random", strategy=STRATEGY,
                                    builder=builder, runner=runner)  # fmt: skip
    return {"trials": records(Path(work_dir))}


def main(argv: Mapping[int, str] | list[str]) -> int:
    depth = int(argv[4])
    out = _child(argv[1], argv[2], int(argv[3]), None if depth == 0 else depth, argv[5] == "1")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

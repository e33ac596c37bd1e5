"""MetaSchedule tuning within a time budget (``--tune-time``), its database cached per machine fingerprint.

A tuned candidate (``tvm-relax-tuned``) tunes each static shape's Relax module with MetaSchedule
(``tune_relax``: replay-trace sampling, random cost model; a first round of :data:`TRIALS_PER_ROUND` trials, then
rounds sized to the budget left at the pace measured (:func:`next_round`); the round under way when the budget
runs out finishes, so the spend can pass it by one round)
and compiles with the records (``compile_relax``). The database lives under
``$LATENCYLAB_CACHE/tvm-tune/<machine>/<model + shape + target>``: ``<machine>`` hashes the CPU (model, flags,
cores), TVM's version and the target, so records measured on one CPU are never applied on another, and a
second search on the same machine finds ``done.json`` there and reuses the records without tuning again (its
``tune_time_s`` is the first search's, reported with ``tuning_reused: true``).

The tuning runs in a child process (``python -m latencylab.optimize.families.tvm_tune``): MetaSchedule's
builders and runners are process pools, and a crash in it must fail one candidate, not the search. (Sessions
12-27 saw one on every try: ``tvm::ffi::ToJSONGraph`` segfaults. The cause was apache-tvm-ffi 0.1.15, which
breaks TVM 0.27.0.post1's JSON serialisation of any TIR module; the ``tvm`` extra now pins ``<0.1.15``, and
the machine key includes tvm-ffi's version, so a crash marker left by the broken pair is not read by the fixed
one.) The builder and runner pools are one process each with long timeouts (:data:`BUILD_TIMEOUT_S`): a pool
worker's first call imports TVM, ~30 s on 2 vCPUs, past MetaSchedule's default 30-s build timeout, which
failed every trial of the first round.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.timing import now_ns

TRIALS_PER_ROUND = 16  # the first round (in steps of it); later ones as many as fit the budget left (next_round)
MAX_ROUND = 512
# Random sampling of each task's design space. The evolutionary search (MetaSchedule's default) spent its first
# 5 minutes on MiniLM's 27 tasks building initial populations before a single trial (measured here, session 28);
# with the random cost model its selection is random anyway, and without xgboost there is no other model.
STRATEGY = "replay-trace"
# Candidates per task per scheduler iteration. The task scheduler first gives every task one iteration: with
# MetaSchedule's 64 (or 16), MiniLM's 27 tasks need 1728 (432) trials before the last is tried, far past what a
# few minutes build on 2 vCPUs (~2.4 s a trial here); with 4, 108.
PER_ITER = 4
BUILD_TIMEOUT_S = 120.0  # per trial, the pool worker's TVM import included
RUN_TIMEOUT_S = 60.0
DONE = "done.json"
CRASHED = "crashed.json"  # beside a machine's databases: MetaSchedule was killed by a signal there
GRACE_S = 300.0  # the child's start (imports, task extraction, the pools' TVM import) and its last round


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
    onnx_path: Path, work_dir: Path, tune_time_s: float, threads: int, clock: Clock | None = None
) -> dict[str, Any]:
    """Tune ``onnx_path`` (static shapes) for ``tune_time_s`` seconds into ``work_dir`` unless a finished
    database is there; returns ``tune_time_s`` (spent, or spent by the search that made it), ``trials``,
    ``tuning_reused``. A failed or crashed tuning raises a LatencyLabError with the child's last line."""
    got = reused(work_dir)
    if got is not None:
        return {**got, "tuning_reused": True, "database": str(work_dir)}
    clk = clock or PerfCounterClock()
    work_dir.mkdir(parents=True, exist_ok=True)
    t0 = now_ns(clk)
    cmd = [sys.executable, "-m", __name__, str(onnx_path), str(work_dir), str(float(tune_time_s)), str(int(threads))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=tune_time_s + GRACE_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LatencyLabError(f"MetaSchedule tuning ran past {tune_time_s + GRACE_S:.0f} s and was stopped") from exc
    spent = (now_ns(clk) - t0) / 1e9
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        why = "signal 11 (segfault)" if proc.returncode in (-11, 139) else f"exit status {proc.returncode}"
        last = next((ln.strip() for ln in reversed(lines) if "Error" in ln or "tvm::" in ln), "")
        msg = f"MetaSchedule tuning crashed: {why}{': ' + last if last else ''}"
        if proc.returncode < 0 or proc.returncode > 128:  # killed by a signal: it will again, on this machine
            (work_dir.parent / CRASHED).write_text(json.dumps({"reason": msg}))
        raise LatencyLabError(msg)
    trials = int(json.loads(proc.stdout.strip().splitlines()[-1]).get("trials", 0))
    record = {"tune_time_s": round(spent, 3), "trials": trials, "budget_s": float(tune_time_s)}
    (work_dir / DONE).write_text(json.dumps(record))
    return {**record, "tuning_reused": False, "database": str(work_dir)}


def fused_for_tuning(mod: Any, target: Any) -> Any:
    """``mod`` legalised and fused as ``compile_relax`` prepares it before it applies the database (library
    dispatch, ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FoldConstant``, ``FuseOps``, ``FuseTIR`` at opt level
    3), so that the tasks tuned are the fused kernels it looks up. MetaSchedule extracts tasks from the TIR
    functions already in a module: on the imported graph (Relax operators, not yet TIR) it found one, a scalar
    ``maximum``, and 384 trials (session 28's first MiniLM run) tuned nothing that mattered."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline

    passes = [
        *relax_pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def _child(onnx_path: str, work_dir: str, tune_time_s: float, threads: int) -> dict[str, Any]:
    """Rounds of MetaSchedule trials into ``work_dir``'s JSON database until ``tune_time_s`` is spent."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from latencylab.optimize.families.tvm_build import host_target, relax_module

    # TVM's own SIGSEGV handler symbolises a backtrace of its 100-MB library (~30 s here): a crash is reported
    # by its signal alone (the parent names it)
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    host = host_target()
    target = tvm.target.Target({**dict(host.export()), "num-cores": max(1, threads)})
    mod = fused_for_tuning(relax_module(Path(onnx_path)), target)
    clk = PerfCounterClock()
    t0 = now_ns(clk)
    # the pools are made once: a worker's first call imports TVM (~30 s here), not once a round
    builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=BUILD_TIMEOUT_S)
    runner = ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)
    trials, n = 0, TRIALS_PER_ROUND
    while trials == 0 or (now_ns(clk) - t0) / 1e9 < tune_time_s:
        r0 = now_ns(clk)
        ms.relax_integration.tune_relax(mod, {}, target, work_dir, max_trials_global=n, num_trials_per_iter=PER_ITER,
                                        cost_model="random", strategy=STRATEGY, builder=builder,
                                        runner=runner)  # fmt: skip
        trials += n
        per_trial = (now_ns(clk) - r0) / 1e9 / n
        left = tune_time_s - (now_ns(clk) - t0) / 1e9
        n = next_round(left, per_trial)
    return {"trials": trials}


def next_round(left_s: float, per_trial_s: float) -> int:
    """The next round's trials: what fits the budget left at the last round's pace, in steps of
    :data:`TRIALS_PER_ROUND`, at least one step and at most :data:`MAX_ROUND`."""
    if per_trial_s <= 0:
        return MAX_ROUND
    fit = int(left_s / per_trial_s) // TRIALS_PER_ROUND * TRIALS_PER_ROUND
    return max(TRIALS_PER_ROUND, min(MAX_ROUND, fit))


def main(argv: Mapping[int, str] | list[str]) -> int:
    out = _child(argv[1], argv[2], float(argv[3]), int(argv[4]))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""Rules over the environment fingerprint every result carries: thread oversubscription and a noisy machine.

*Oversubscription*: threads per process x processes > usable CPUs (the affinity mask, else logical CPUs).
Threads per process = the largest of torch's intra-op threads, the thread env vars (OMP_NUM_THREADS, ...)
and the result's ``config.threads``, as read after warm-up when the profiler recorded that
(``env.after_warmup``: a pipeline may set its threads on its first call, after the fingerprint was taken);
processes = the result's ``config.processes`` / ``config.workers`` /
``server.processes`` / ``server.workers`` (1 when none is recorded). env's own lint check is included.
*Noisy environment*: the ``latencylab env`` lint codes that make numbers noisy on any machine (busy
machine, debugger, coverage, debug build of Python, a non-performance governor, frequency scaling, steal
time); "busy" is judged by what the run measured (``env.run``: other processes' CPU, steal, preemptions),
not by the 1-minute load average, when the result has it (``latencylab.autoprobe.busy_verdict``). A VM
that does not expose its governor, or SMT, is not flagged here (``latencylab env`` lists them). Findings
are merged across results that share a fingerprint's verdict.
*Thread change*: the thread settings read after warm-up differ from the fingerprint's (not counting a
change to ``config.threads``, which the profiler itself makes).

The cost of oversubscription cannot be read from a file; ``diagnose --pipeline`` / ``--workload`` / ``--deep``
measure it (``latencylab.diagnose.threadcost``) and add it to the finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latencylab import env as envmod
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

NOISY = {"busy": "warning", "debugger": "critical", "coverage": "critical", "debug-build": "critical",
         "governor": "warning", "turbo": "info", "steal": "warning"}  # fmt: skip


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _get(d: Any, *path: str) -> Any:
    for k in path:
        d = d.get(k) if isinstance(d, Mapping) else None
    return d


def _threads(doc: Mapping[str, Any], fp: Mapping[str, Any]) -> tuple[int | None, str]:
    found: list[tuple[int, str]] = []
    after = _get(fp, "after_warmup", "threads")
    if (n := _int(_get(after, "torch_intra_op"))) is not None:
        found.append((n, "torch intra-op threads (read after warm-up)"))
    elif (n := _int(_get(fp, "threads", "torch_intra_op"))) is not None:
        found.append((n, "torch intra-op threads"))
    for var, val in (_get(after, "env") or _get(fp, "threads", "env") or {}).items():
        if (n := _int(val)) is not None and var.endswith("NUM_THREADS") and "INTER" not in var:
            found.append((n, var))
    if (n := _int(_get(doc, "config", "threads"))) is not None:
        found.append((n, "config.threads"))
    if not found:
        return None, ""
    return max(found)


def _processes(doc: Mapping[str, Any]) -> tuple[int, str]:
    for path in (("config", "processes"), ("config", "workers"), ("server", "processes"), ("server", "workers")):
        if (n := _int(_get(doc, *path))) is not None and n >= 1:
            return n, ".".join(path)
    return 1, ""


def _thread_change(r: LoadedResult, fp: Mapping[str, Any], cpus: int | None) -> Finding | None:
    before, after = _get(fp, "threads"), _get(fp, "after_warmup", "threads")
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return None
    mine = _int(_get(r.doc, "config", "threads"))
    changes = []
    b, a = _int(before.get("torch_intra_op")), _int(after.get("torch_intra_op"))
    if a is not None and a != b and a != mine and (b is not None or (cpus is not None and a > cpus)):
        changes.append(("torch intra-op threads", b, a))
    for var, val in (after.get("env") or {}).items():
        old = (before.get("env") or {}).get(var)
        if val != old:
            changes.append((var, old, val))
    if not changes:
        return None
    over = any(cpus is not None and (_int(new) or 0) > cpus for _, _, new in changes)
    text = "; ".join(f"{what} {old if old is not None else 'unread'} -> {new}" for what, old, new in changes)
    return Finding(
        rule="thread-change",
        severity="warning" if over else "info",
        title=f"thread settings changed during warm-up, after the environment was recorded: {text}",
        evidence=tuple(Evidence(what, f"{old} -> {new}") for what, old, new in changes)
        + ((Evidence("usable CPUs", cpus),) if cpus else ()),
        recommendation=(
            "the pipeline sets its own thread count on its first calls (torch.set_num_threads, an env var set at "
            "run time): set it once, before the model is built, to at most the usable CPUs, so what the run "
            "measured is what the fingerprint says"
        ),
        source=r.source,
        details={"changes": [{"what": w, "before": o, "after": n} for w, o, n in changes]},
    )


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out_changes: list[Finding] = []
    over: dict[str, tuple[Finding, list[str]]] = {}
    noisy: dict[str, tuple[Finding, list[str]]] = {}
    for r in results:
        fp = r.doc.get("env")
        if not isinstance(fp, Mapping) or not fp:
            continue
        cpus = _int(_get(fp, "cpu", "affinity")) or _int(_get(fp, "cpu", "logical_cpus"))
        if (change := _thread_change(r, fp, cpus)) is not None:
            out_changes.append(change)
        threads, t_from = _threads(r.doc, fp)
        procs, p_from = _processes(r.doc)
        warnings = envmod.lint(dict(fp))
        lint_over = [w for w in warnings if w.code == "oversubscription"]
        if cpus and threads and (threads * procs > cpus or lint_over):
            key = f"{threads}x{procs}>{cpus}|{[w.message for w in lint_over]}"
            if key not in over:
                ev = [
                    Evidence("threads per process", threads, "", None, None),
                    Evidence("threads come from", t_from),
                    Evidence("processes", procs),
                    Evidence("usable CPUs", cpus),
                    *(Evidence("env lint", w.message) for w in lint_over),
                ]
                pre = _get(fp, "run", "involuntary_switches_per_s")
                if pre is not None:
                    ev.append(Evidence("this process preempted during the run", pre, "/s"))
                ev.append(
                    Evidence(
                        "cost",
                        "not measured from a file: `latencylab diagnose --pipeline MOD:FACTORY` (or --deep) "
                        "measures it",
                    )
                )
                if p_from:
                    ev.insert(3, Evidence("processes come from", p_from))
                f = Finding(
                    rule="thread-oversubscription",
                    severity="warning",
                    title=f"{threads} threads x {procs} process(es) = {threads * procs} threads on {cpus} usable CPUs",
                    evidence=tuple(ev),
                    recommendation=(
                        f"give each process at most {max(1, cpus // procs)} intra-op thread(s) "
                        "(torch.set_num_threads / OMP_NUM_THREADS / ORT intra_op_num_threads) so threads x processes "
                        "<= CPUs, and pin processes to disjoint cores (taskset); contended threads wait for each "
                        "other at every parallel region, which grows the tail"
                    ),
                    source=r.source,
                    details={"threads": threads, "processes": procs, "cpus": cpus},
                )
                over[key] = (f, [])
            over[key][1].append(r.source)
        bad = [w for w in warnings if w.code in NOISY]
        if bad:
            key = "|".join(sorted(w.code for w in bad))
            if key not in noisy:
                order = ("critical", "warning", "info")
                sev = min((NOISY[w.code] for w in bad), key=order.index)
                f = Finding(
                    rule="noisy-environment",
                    severity=sev,
                    title="noisy environment: " + "; ".join(w.code for w in bad),
                    evidence=tuple(Evidence(w.code, w.message) for w in bad),
                    recommendation="; ".join(dict.fromkeys(w.hint for w in bad))
                    + "; then re-measure (latencylab env shows the fingerprint)",
                    source=r.source,
                    details={"codes": [w.code for w in bad]},
                )
                noisy[key] = (f, [])
            noisy[key][1].append(r.source)
    out = list(out_changes)
    for f, sources in [*over.values(), *noisy.values()]:
        out.append(_with_sources(f, sources))
    return out


def _with_sources(f: Finding, sources: list[str]) -> Finding:
    from dataclasses import replace

    uniq = list(dict.fromkeys(sources))
    return replace(f, source=", ".join(uniq))

"""Rule ``machine-speed``: the machine-speed canary (``env.canary``, see ``latencylab.canary``).

* Within one result: the canary's readings (before, between and after the runs) moved by more than
  ``canary.THRESHOLD`` (``drift``: slowest - fastest reading over their median): the machine's speed
  changed while it was measured. Steal time above ``canary.STEAL_WARN``: the hypervisor took cycles.
* Across results: the CPU kernel of a later result differs from the first result's by more than the
  threshold: "the machine was N% slower in B's run than in A's"; any comparison of the two measures
  the machine as much as the program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latencylab.canary import STEAL_WARN, THRESHOLD, compare_canaries
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE = "machine-speed"


def _canary(r: LoadedResult) -> Mapping[str, Any] | None:
    env = r.doc.get("env")
    c = env.get("canary") if isinstance(env, Mapping) else None
    return c if isinstance(c, Mapping) and c.get("cpu_ns") else None


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    with_canary = [(r, c) for r in results if (c := _canary(r)) is not None]
    for r, c in with_canary:
        drift, steal = c.get("drift"), c.get("steal_fraction")
        readings = [x for x in c.get("readings") or () if isinstance(x, Mapping)]
        if isinstance(drift, (int, float)) and drift > THRESHOLD:
            ev = [Evidence("canary drift (slowest - fastest reading) / median", round(100 * drift, 1), "%")]
            for x in readings:
                cpu = sorted(x.get("cpu_ns") or [0])
                ev.append(Evidence(f"CPU kernel, {x.get('at')}", round(cpu[len(cpu) // 2] / 1e6, 3), "ms",
                                   x.get("t_s"), x.get("t_s")))  # fmt: skip
            out.append(
                Finding(
                    RULE, "warning", f"the machine's speed moved {drift:.0%} while this was measured (canary)",
                    tuple(ev),
                    "runs measured at different machine speeds differ for that reason alone: compare with "
                    "profile --runs N (the spread between runs becomes the noise floor) or interleaved "
                    "(compare --run A B), and find what else runs on the machine",
                    r.source, {"drift": drift},
                )
            )  # fmt: skip
        if isinstance(steal, (int, float)) and steal > STEAL_WARN:
            out.append(
                Finding(
                    RULE, "warning", f"the hypervisor took {steal:.0%} of the CPU time (steal) while this was measured",
                    (Evidence("steal time / all CPU time", round(100 * steal, 1), "%"),),
                    "a neighbour on the host is taking cycles: measure on a dedicated host, or compare interleaved",
                    r.source, {"steal_fraction": steal},
                )
            )  # fmt: skip
    if len(with_canary) >= 2:
        first, c0 = with_canary[0]
        for r, c in with_canary[1:]:
            d = compare_canaries(c0, c)
            if d is None or not d.moved:
                continue
            out.append(
                Finding(
                    RULE, "warning", d.describe((first.source, r.source)),
                    (
                        Evidence(f"CPU kernel, {first.source}", round(d.baseline_ns / 1e6, 3), "ms"),
                        Evidence(f"CPU kernel, {r.source}", round(d.candidate_ns / 1e6, 3), "ms"),
                        Evidence("change", round(100 * d.slower, 1), "%"),
                        Evidence("threshold", round(100 * d.threshold, 1), "%"),
                    ),
                    "a latency difference between these results is, in part or whole, the machine's: compare them "
                    "interleaved (latencylab compare --run A B) instead",
                    f"{first.source}, {r.source}", {"slower": d.slower, "threshold": d.threshold},
                )
            )  # fmt: skip
    return out

"""Run every rule over result files.

``load_result`` reads any latencylab result (profile, load, optimize, the optimize experiments' kinds,
serve...) into a :class:`LoadedResult` through the one reader (:func:`latencylab.results.read_result`); a bad
file is one :class:`LatencyLabError` line. ``loaded`` does the same for a document already in memory.
``diagnose_results`` runs every rule in :data:`latencylab.diagnose.rules.RULES` and returns the findings,
most severe first (rule order, then source order, within a severity).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latencylab.findings import SEVERITIES, Evidence, Finding
from latencylab.results import LoadedResult, kind_version, loaded, read_result

__all__ = ["diagnose_results", "findings_doc", "load_result", "loaded"]


def load_result(path: str | Path) -> LoadedResult:
    """Read one result file (any kind); raises a one-line LatencyLabError for a missing or malformed file."""
    return read_result(path)


def _rank(f: Finding) -> int:
    return -SEVERITIES.index(f.severity)


def diagnose_results(results: Sequence[LoadedResult]) -> list[Finding]:
    """Every rule's findings over ``results``, most severe first.

    A rule that crashes on an unexpected document does not hide the others: its error becomes an info
    finding (rule ``diagnose-error``) naming the rule.
    """
    from latencylab.diagnose.rules import RULES

    findings: list[Finding] = []
    for name, rule in RULES.items():
        try:
            findings.extend(rule(results))
        except Exception as exc:  # one malformed document must not silence the other rules
            first = (str(exc).strip().splitlines() or [""])[0]
            findings.append(
                Finding(
                    rule="diagnose-error",
                    severity="info",
                    title=f"rule {name} could not read these results: {type(exc).__name__}: {first}",
                    evidence=(Evidence("rule", name),),
                    recommendation="report this with the result file; the other rules ran normally",
                )
            )
    return sorted(findings, key=_rank)  # stable: rule order is kept within a severity


def findings_doc(findings: Sequence[Finding], sources: Sequence[str] = ()) -> dict[str, Any]:
    """The ``--json`` document: {"kind": "diagnose", "schema_version": 1, "findings": [...]}."""
    from latencylab.results.base import utc_now

    return {
        "kind": "diagnose",
        "schema_version": kind_version("diagnose"),
        "created_at": utc_now(),
        "sources": list(sources),
        "findings": [f.to_dict() for f in findings],
    }

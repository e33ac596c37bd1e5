"""Load result files and run every rule over them.

``load_result`` reads any latencylab result (profile, load, optimize, the optimize experiments' kinds,
serve...) into a :class:`LoadedResult`; a bad file is one :class:`LatencyLabError` line. Profile results are
validated by parsing them, because the rules read them through :class:`latencylab.results.ProfileResult`.
``diagnose_results`` runs every rule in :data:`latencylab.diagnose.rules.RULES` and returns the findings,
most severe first (rule order, then source order, within a severity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from latencylab.diagnose.types import SEVERITIES, Evidence, Finding, LoadedResult
from latencylab.errors import LatencyLabError
from latencylab.results import SCHEMA_VERSION, ProfileResult


def loaded(doc: Mapping[str, Any], source: str) -> LoadedResult:
    """A parsed result document as the rules see it (validates kind and schema version)."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise LatencyLabError(f"{source}: not a latencylab result (no 'kind')")
    version = doc.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        raise LatencyLabError(
            f"{source}: unsupported schema_version {version!r} (this latencylab reads {SCHEMA_VERSION})"
        )
    if kind == "profile":
        try:
            ProfileResult.from_dict(doc)
        except LatencyLabError as exc:
            raise LatencyLabError(f"{source}: {exc}") from exc
    return LoadedResult(source=source, kind=kind, doc=doc)


def load_result(path: str | Path) -> LoadedResult:
    """Read one result file (any kind); raises a one-line LatencyLabError for a missing or malformed file."""
    from latencylab.results import read_json_object

    p = Path(path)
    return loaded(read_json_object(p), str(p))


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
    from latencylab.results import utc_now

    return {
        "kind": "diagnose",
        "schema_version": SCHEMA_VERSION,
        "created_at": utc_now(),
        "sources": list(sources),
        "findings": [f.to_dict() for f in findings],
    }

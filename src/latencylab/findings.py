"""Findings: what diagnose's rules (and roofline's placement) conclude, with the evidence behind it.

A neutral module on the ground floor, so that whatever produces findings (``diagnose``, ``roofline``) and
whatever renders them (``report``, ``compare``) share the type without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Evidence:
    """One figure behind a finding: what was measured, its value and unit, optionally where in the run."""

    label: str
    value: float | str
    unit: str = ""
    t_start_s: float | None = None  # time range in the run the figure refers to (seconds from its start)
    t_end_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "value": self.value,
            "unit": self.unit,
            "t_start_s": self.t_start_s,
            "t_end_s": self.t_end_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evidence:
        return cls(str(d["label"]), d["value"], str(d.get("unit", "")), d.get("t_start_s"), d.get("t_end_s"))


@dataclass(frozen=True)
class Finding:
    """A symptom turned into a diagnosis: which rule, how bad, the evidence, and what to do about it."""

    rule: str  # stable id, e.g. "preprocess-dominates"
    severity: str  # one of SEVERITIES
    title: str  # one line, e.g. "preprocessing is 61% of end-to-end time"
    evidence: tuple[Evidence, ...]
    recommendation: str
    source: str = ""  # the result file (or "live run") it came from
    details: Mapping[str, Any] = field(default_factory=dict)  # rule-specific data for plots (JSON-safe)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "evidence": [e.to_dict() for e in self.evidence],
            "recommendation": self.recommendation,
            "source": self.source,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        return cls(
            rule=str(d["rule"]),
            severity=str(d["severity"]),
            title=str(d["title"]),
            evidence=tuple(Evidence.from_dict(e) for e in d.get("evidence", [])),
            recommendation=str(d.get("recommendation", "")),
            source=str(d.get("source", "")),
            details=dict(d.get("details", {})),
        )

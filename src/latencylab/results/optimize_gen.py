"""The ``optimize-gen`` result: ``latencylab optimize --workload gen``'s search, read back.

The document is written by :func:`latencylab.optimize.gen_lab.result_doc`: ``summary`` (budget, baseline,
chosen, verdict, ``speedups`` per candidate: the equal-work TPOT speed-up over the baseline with the paired
ratio CI, and the TTFT one), ``candidates`` (one document each: name, family, status, reason, fidelity,
TTFT/TPOT percentiles, speculative acceptance), ``model``, ``config``, ``inputs``, ``env``, and ``recipe``
(the path of the recipe written with ``--out``, or, with ``--recipe``, what it recorded and what it
reproduced). Readers get :class:`OptimizeGenResult`: the document, with one typed
:class:`GenCandidateRow` per candidate; every key but ``summary``, ``candidates`` and a candidate's
``name`` and ``status`` is optional (read as None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.results.document import check_header

KIND = "optimize-gen"
REQUIRED = ("summary", "candidates")
MEASURED_KEYS = ("tpot_ms", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "acceptance", "tokens_per_step")
FIDELITY_KEYS = ("token_agreement", "exact", "top1", "ppl_delta", "perplexity")
SPEEDUP_KEYS = ("tpot", "ratio_ci_low", "ratio_ci_high", "ttft")


def _num(v: Any, what: str) -> float | None:
    """``v`` as a float (None for null or NaN); one-line error for anything else."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise LatencyLabError(f"malformed {KIND} result: {what} is {v!r}, not a number")
    return None if math.isnan(v) else float(v)


def _mapping(v: Any, what: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise LatencyLabError(f"malformed {KIND} result: {what} is not an object")
    return v


@dataclass(frozen=True, slots=True)
class GenCandidateRow:
    """One candidate as the report and diagnose read it (None: not in the document, or not measured)."""

    name: str
    family: str
    status: str  # baseline | inside-budget | outside-budget | skipped | failed
    reason: str
    exact_by_construction: bool
    threads: int | None
    tpot_ms: float | None  # equal work: decode time summed over the timed requests / decode tokens
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    acceptance: float | None  # speculative: accepted / proposed draft tokens
    tokens_per_step: float | None
    token_agreement: float | None
    exact: float | None
    top1: float | None
    ppl_delta: float | None
    perplexity: float | None
    speedup_tpot: float | None  # the baseline's equal-work TPOT / this one's
    ratio_ci_low: float | None  # 95% CI of the paired TPOT ratios' geometric mean (candidate / baseline)
    ratio_ci_high: float | None
    speedup_ttft: float | None  # the baseline's median TTFT / this one's

    @property
    def measured(self) -> bool:
        return self.tpot_ms is not None

    @property
    def in_budget(self) -> bool:
        return self.status in ("baseline", "inside-budget")

    @property
    def has_fidelity(self) -> bool:
        return self.token_agreement is not None

    @classmethod
    def from_dict(cls, c: Any, i: int, speedups: Mapping[str, Any]) -> GenCandidateRow:
        if not isinstance(c, Mapping):
            raise LatencyLabError(f"malformed {KIND} result: candidate {i} is not an object")
        name, status = c.get("name"), c.get("status")
        if not isinstance(name, str) or not name:
            raise LatencyLabError(f"malformed {KIND} result: candidate {i} has no name")
        if not isinstance(status, str):
            raise LatencyLabError(f"malformed {KIND} result: candidate {name!r} has no status")
        who = f"candidate {name!r}"
        fid = _mapping(c.get("fidelity"), f"{who}'s fidelity")
        sp = _mapping(speedups.get(name), f"the speed-up of {who}")
        m = {k: _num(c.get(k), f"{who}'s {k}") for k in MEASURED_KEYS}
        f = {k: _num(fid.get(k), f"{who}'s fidelity {k}") for k in FIDELITY_KEYS}
        s = {k: _num(sp.get(k), f"{who}'s speed-up {k}") for k in SPEEDUP_KEYS}
        threads = (c.get("params") or {}).get("threads") if isinstance(c.get("params"), Mapping) else None
        return cls(
            name=name, family=str(c.get("family") or ""), status=status, reason=str(c.get("reason") or ""),
            exact_by_construction=bool(c.get("exact_by_construction")),
            threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else None,
            **m, **f, speedup_tpot=s["tpot"], ratio_ci_low=s["ratio_ci_low"], ratio_ci_high=s["ratio_ci_high"],
            speedup_ttft=s["ttft"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class OptimizeGenResult:
    """One ``latencylab optimize --workload gen`` run (module docstring): the document and its typed rows."""

    doc: Mapping[str, Any]
    rows: tuple[GenCandidateRow, ...]

    @property
    def kind(self) -> str:
        return KIND

    @property
    def schema_version(self) -> int:
        return int(self.doc["schema_version"])

    @property
    def summary(self) -> Mapping[str, Any]:
        return self.doc["summary"]

    @property
    def budget(self) -> str:
        return str(self.summary.get("budget") or "")

    @property
    def baseline(self) -> str | None:
        b = self.summary.get("baseline")
        return str(b) if b is not None else (self.rows[0].name if self.rows else None)

    @property
    def chosen(self) -> str | None:
        c = self.summary.get("chosen")
        return None if c is None else str(c)

    @property
    def verdict(self) -> str:
        return str(self.summary.get("verdict") or "")

    @property
    def tokens(self) -> int | None:
        t = self.summary.get("tokens")
        return int(t) if isinstance(t, int | float) else None

    @property
    def rounds(self) -> int | None:
        r = self.summary.get("rounds")
        return int(r) if isinstance(r, int | float) else None

    @property
    def recipe_path(self) -> str | None:
        """The recipe written (``--out``) or applied (``--recipe``), else None."""
        rec = self.doc.get("recipe")
        if isinstance(rec, Mapping):
            return str(rec.get("path")) if rec.get("path") else None
        return str(rec) if rec else None

    @property
    def recipe_check(self) -> Mapping[str, Any] | None:
        """With ``--recipe``: ``{path, recorded, reproduced, forced}``; else None."""
        rec = self.doc.get("recipe")
        return rec if isinstance(rec, Mapping) else None

    @property
    def model(self) -> Mapping[str, Any]:
        m = self.doc.get("model")
        return m if isinstance(m, Mapping) else {}

    @property
    def env(self) -> Mapping[str, Any]:
        return self.doc.get("env") or {}

    def row(self, name: str) -> GenCandidateRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.doc)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OptimizeGenResult:
        check_header(d, KIND, REQUIRED)
        s = _mapping(d["summary"], "summary")
        cands = d["candidates"]
        if not isinstance(cands, list):
            raise LatencyLabError(f"malformed {KIND} result: candidates is not a list")
        speedups = _mapping(s.get("speedups"), "summary.speedups")
        rows = tuple(GenCandidateRow.from_dict(c, i, speedups) for i, c in enumerate(cands))
        names = {r.name for r in rows}
        for key in ("baseline", "chosen"):
            v = s.get(key)
            if v is not None and v not in names:
                raise LatencyLabError(f"malformed {KIND} result: summary.{key} {v!r} is not a candidate")
        return cls(dict(d), rows)

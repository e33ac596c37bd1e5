"""Latency budgets: an end-to-end deadline (or a physical one), per-stage allowances, and a verdict.

A budget file (TOML) says how long one inference may take and how that time is shared out::

    quantile = "p99"            # which quantile is held to the budget (default p99; 0.99 also accepted)
    deadline_ms = 3.0           # the end-to-end deadline ...

    [physical]                  # ... or derived from the physics: distance / speed - reserve
    speed_m_s = 30.0            # how fast the object (vehicle, belt, part) moves
    distance_m = 3.0            # how far it may travel before the answer is needed
    reserve_ms = 20.0           # optional: time the rest of the system needs (actuator, network)

    [stages]                    # optional: per-stage allowances in ms (stage names of the profile)
    decode = 0.8
    forward = 1.2

``evaluate_budget`` holds a :class:`~latencylab.results.ProfileResult` to it: the chosen quantile of the
end-to-end latency against the deadline, and of each stage against its allowance (definitions in
docs/metrics.md, "Latency budget"). The stage that breaks the budget first is the one most over its
allowance, relative to it (measured / allowance): if every stage slowed down by the same factor, that
stage would be the first to cross its line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.files import read_toml
from latencylab.results import ProfileResult

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Budget",
    "BudgetRow",
    "BudgetVerdict",
    "evaluate_budget",
    "load_budget",
    "parse_budget",
    "render_budget_verdict",
]

DEFAULT_QUANTILE = 0.99
_TOP_KEYS = {"quantile", "deadline_ms", "physical", "stages", "name"}
_PHYSICAL_KEYS = {"speed_m_s", "distance_m", "reserve_ms"}


@dataclass(frozen=True, slots=True)
class Budget:
    """An end-to-end deadline, optional per-stage allowances (ms), and the quantile held to them."""

    deadline_ms: float
    quantile: float = DEFAULT_QUANTILE
    stages: Mapping[str, float] | None = None  # stage name -> allowance (ms); None = end-to-end only
    origin: str = ""  # how the deadline was set, e.g. "3 m / 30 m/s - 20 ms reserve"
    name: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_ms) and self.deadline_ms > 0):
            raise LatencyLabError(f"the end-to-end deadline must be a positive number of ms, got {self.deadline_ms}")
        if not 0 < self.quantile < 1:
            raise LatencyLabError(f"budget quantile must be a fraction in (0, 1), e.g. 0.99, got {self.quantile}")
        for stage, ms in (self.stages or {}).items():
            if not (math.isfinite(ms) and ms > 0):
                raise LatencyLabError(f"allowance of stage {stage!r} must be a positive number of ms, got {ms}")

    @property
    def allocated_ms(self) -> float:
        """Sum of the stage allowances (0 without any)."""
        return float(sum((self.stages or {}).values()))

    def warnings(self) -> tuple[str, ...]:
        if self.stages and self.allocated_ms > self.deadline_ms * (1 + 1e-9):
            return (
                f"the stage allowances add up to {self.allocated_ms:g} ms, more than the {self.deadline_ms:g} ms "
                "deadline: every stage can be within its allowance and the deadline still missed",
            )
        return ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "deadline_ms": self.deadline_ms,
            "quantile": self.quantile,
            "stages": None if self.stages is None else dict(self.stages),
            "origin": self.origin,
        }


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LatencyLabError(f"{what} must be a number, got {value!r}")
    return float(value)


def _quantile(value: Any) -> float:
    """'p99' / 'p99.9' / 0.99 -> fraction; 99 is refused (fractions everywhere, as in the rest of latencylab)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if not text.startswith("p"):
            raise LatencyLabError(f"budget quantile {value!r} must look like p99 or p99.9 (or 0.99)")
        try:
            q = float(text[1:]) / 100
        except ValueError:
            raise LatencyLabError(f"budget quantile {value!r} must look like p99 or p99.9 (or 0.99)") from None
    else:
        q = _number(value, "quantile")
        if q >= 1:
            raise LatencyLabError(f'budget quantile {value!r} is not a fraction: write 0.99 or "p99", not 99')
    if not 0 < q < 1:
        raise LatencyLabError(f"budget quantile {value!r} must be between p0 and p100")
    return q


def parse_budget(doc: Mapping[str, Any], where: str = "budget") -> Budget:
    """A :class:`Budget` from the parsed TOML document (see the module docstring for the keys)."""
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise LatencyLabError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    has_deadline, physical = "deadline_ms" in doc, doc.get("physical")
    if has_deadline == (physical is not None):
        raise LatencyLabError(f"{where}: give exactly one of deadline_ms or a [physical] table")
    if physical is not None:
        if not isinstance(physical, Mapping):
            raise LatencyLabError(f"{where}: [physical] must be a table with speed_m_s and distance_m")
        unknown = set(physical) - _PHYSICAL_KEYS
        if unknown or not {"speed_m_s", "distance_m"} <= set(physical):
            raise LatencyLabError(
                f"{where}: [physical] needs speed_m_s and distance_m (optional reserve_ms), got {sorted(physical)}"
            )
        speed = _number(physical["speed_m_s"], "physical.speed_m_s")
        distance = _number(physical["distance_m"], "physical.distance_m")
        reserve = _number(physical.get("reserve_ms", 0.0), "physical.reserve_ms")
        if speed <= 0 or distance <= 0 or reserve < 0:
            raise LatencyLabError(f"{where}: speed and distance must be > 0 and reserve_ms >= 0")
        travel_ms = distance / speed * 1e3
        deadline = travel_ms - reserve
        origin = f"{distance:g} m / {speed:g} m/s = {travel_ms:g} ms"
        if reserve:
            origin += f", minus {reserve:g} ms reserve"
        if deadline <= 0:
            raise LatencyLabError(f"{where}: {origin} leaves no time for inference")
    else:
        deadline = _number(doc["deadline_ms"], "deadline_ms")
        origin = "deadline_ms"
    stages_doc = doc.get("stages")
    stages: dict[str, float] | None = None
    if stages_doc is not None:
        if not isinstance(stages_doc, Mapping) or not stages_doc:
            raise LatencyLabError(f"{where}: [stages] must be a table of stage = allowance in ms")
        stages = {str(k): _number(v, f"stages.{k}") for k, v in stages_doc.items()}
    return Budget(
        deadline_ms=deadline,
        quantile=_quantile(doc.get("quantile", DEFAULT_QUANTILE)),
        stages=stages,
        origin=origin,
        name=str(doc.get("name", "")),
    )


def load_budget(path: str | Path) -> Budget:
    """Read a budget TOML file (one-line errors for a missing or malformed file)."""
    p = Path(path)
    doc = read_toml(p, "budget file")
    budget = parse_budget(doc, str(p))
    return budget if budget.name else Budget(budget.deadline_ms, budget.quantile, budget.stages, budget.origin, p.stem)


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One line of the verdict: a stage (or "end-to-end"), its allowance and the measured quantile."""

    name: str
    measured_ms: float
    allowance_ms: float | None  # None: a stage the budget gives no allowance to
    share: float  # the stage's share of measured time (1.0 for end-to-end)

    @property
    def over_by_ms(self) -> float | None:
        """measured - allowance (negative: headroom); None without an allowance."""
        return None if self.allowance_ms is None else self.measured_ms - self.allowance_ms

    @property
    def ratio(self) -> float | None:
        """measured / allowance; > 1 is over."""
        return None if self.allowance_ms is None else self.measured_ms / self.allowance_ms

    @property
    def ok(self) -> bool | None:
        return None if self.allowance_ms is None else self.measured_ms <= self.allowance_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured_ms": self.measured_ms,
            "allowance_ms": self.allowance_ms,
            "over_by_ms": self.over_by_ms,
            "ratio": self.ratio,
            "ok": self.ok,
            "share": self.share,
        }


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """``budget`` held against one profile: ``ok`` when end-to-end and every allowed stage are within."""

    budget: Budget
    workload: str
    n: int
    end_to_end: BudgetRow
    stages: tuple[BudgetRow, ...]  # in pipeline order
    breaking_stage: str | None  # the stage most over its allowance (relative); None when no stage is over
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.end_to_end.ok) and all(r.ok is not False for r in self.stages)

    @property
    def over_stages(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.stages if r.ok is False)

    def row(self, name: str) -> BudgetRow:
        for r in self.stages:
            if r.name == name:
                return r
        raise KeyError(name)

    def headline(self) -> str:
        q = stats.format_q(self.budget.quantile)
        e2e = self.end_to_end
        head = f"{q} end-to-end {e2e.measured_ms:.3g} ms vs deadline {self.budget.deadline_ms:.3g} ms: " + (
            "within" if e2e.ok else f"over by {e2e.over_by_ms:.3g} ms"
        )
        if self.breaking_stage is not None:
            r = self.row(self.breaking_stage)
            assert r.ratio is not None and r.over_by_ms is not None
            head += (
                f"; breaks first: {r.name} ({q} {r.measured_ms:.3g} ms, allowance {r.allowance_ms:.3g} ms, "
                f"{r.ratio:.2f}x, over by {r.over_by_ms:.3g} ms)"
            )
        return ("BUDGET MET: " if self.ok else "BUDGET BROKEN: ") + head

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget.to_dict(),
            "workload": self.workload,
            "n": self.n,
            "ok": self.ok,
            "end_to_end": self.end_to_end.to_dict(),
            "stages": [r.to_dict() for r in self.stages],
            "breaking_stage": self.breaking_stage,
            "warnings": list(self.warnings),
        }


def evaluate_budget(budget: Budget, result: ProfileResult) -> BudgetVerdict:
    """Hold ``result`` to ``budget``: type-7 quantile ``budget.quantile`` of each stage and of end-to-end."""
    names = result.stage_names
    unknown = [s for s in (budget.stages or {}) if s not in names]
    if unknown:
        raise LatencyLabError(
            f"budget allowance for stage(s) {unknown} that the {result.workload} profile does not have "
            f"(its stages: {', '.join(names)})"
        )
    q = budget.quantile
    e2e = result.end_to_end_ns()
    total = float(e2e.sum()) or 1.0
    rows = tuple(
        BudgetRow(
            name=s.name,
            measured_ms=stats.quantile(s.array(), q) / 1e6,
            allowance_ms=None if budget.stages is None else budget.stages.get(s.name),
            share=float(np.sum(s.array())) / total,
        )
        for s in result.stages
    )
    end_to_end = BudgetRow("end-to-end", stats.quantile(e2e, q) / 1e6, budget.deadline_ms, 1.0)
    over = [r for r in rows if r.ok is False]
    breaking = max(over, key=lambda r: (r.ratio or 0.0, r.over_by_ms or 0.0)).name if over else None
    warnings = list(budget.warnings())
    tail = int(result.n * (1 - q))
    if result.n < stats.samples_needed(q):
        warnings.append(
            f"{stats.format_q(q)} rests on {tail} tail samples of {result.n}: "
            f"need {stats.samples_needed(q)} iterations for a stable figure"
        )
    return BudgetVerdict(budget, result.workload, result.n, end_to_end, rows, breaking, tuple(warnings))


def _fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def render_budget_verdict(verdict: BudgetVerdict, console: Console) -> None:
    """The verdict as a rich table: allowance, measured quantile, over-by per stage and end-to-end."""
    from rich.table import Table

    b = verdict.budget
    q = stats.format_q(b.quantile)
    title = f"latency budget{f' {b.name}' if b.name else ''}: {q} <= {b.deadline_ms:g} ms end-to-end"
    if b.origin and b.origin != "deadline_ms":
        title += f" ({b.origin})"
    t = Table(title=title, title_justify="left")
    for col in ("stage", "allowance ms", f"measured {q} ms", "over by ms", "x allowance", "verdict"):
        t.add_column(col, justify="left" if col in ("stage", "verdict") else "right")
    for r in (*verdict.stages, verdict.end_to_end):
        if r.ok is None:
            mark = "[dim]no allowance[/dim]"
        elif r.ok:
            mark = "[green]within[/green]"
        else:
            mark = "[bold red]OVER[/bold red]" + (" (breaks first)" if r.name == verdict.breaking_stage else "")
        name = f"[bold]{r.name}[/bold]" if r is verdict.end_to_end else r.name
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        t.add_row(name, _fmt(r.allowance_ms), _fmt(r.measured_ms), _fmt(r.over_by_ms, True), ratio, mark)
    console.print(t)
    style = "green" if verdict.ok else "bold red"
    console.print(f"[{style}]{verdict.headline()}[/{style}]")
    for w in verdict.warnings:
        console.print(f"[yellow]budget:[/yellow] {w}")

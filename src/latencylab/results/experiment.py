"""The optimize experiments' results (``shape-policy``, ``pipeline-overlap``, ``sweep``), read back.

The experiments (:mod:`latencylab.optimize.experiments`) write their frozen dataclasses with
:func:`experiment_doc`: the shared header, then the fields (``dataclasses.asdict``), with each class adding
its derived figures beside the raw samples. Readers (diagnose, report) get :class:`ExperimentResult`: the
document with the accessors every experiment shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latencylab.results.document import check_header

KINDS = ("shape-policy", "pipeline-overlap", "sweep")
_HEADER = ("kind", "schema_version", "created_at")


def experiment_doc(result: Any, **derived: Any) -> dict[str, Any]:
    """A frozen experiment result as its document: the header (``schema_version``, ``kind``, ``created_at``),
    then every field in declaration order (tuples as lists, nested dataclasses as dicts), then ``derived``
    (fields whose document is not their ``asdict`` form replace it: e.g. ``policies=[p.to_dict() ...]``)."""
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in _HEADER}
    body = {k: derived.pop(k) if k in derived else _plain(v) for k, v in fields.items()}
    head = {"schema_version": result.schema_version, "kind": result.kind, "created_at": result.created_at}
    return {**head, **body, **derived}


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    return v


@dataclass(frozen=True, slots=True)
class ExperimentResult:
    """A ``shape-policy``, ``pipeline-overlap`` or ``sweep`` document with the accessors they share."""

    doc: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def schema_version(self) -> int:
        return int(self.doc["schema_version"])

    @property
    def conclusion(self) -> str:
        return str(self.doc.get("conclusion", ""))

    @property
    def env(self) -> Mapping[str, Any]:
        return self.doc.get("env") or {}

    def to_dict(self) -> dict[str, Any]:
        return dict(self.doc)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExperimentResult:
        check_header(d, KINDS)
        return cls(dict(d))

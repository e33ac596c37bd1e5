"""A result kind read as its JSON document (kinds whose readers need no more than their keys)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.results.registry import kind_version


def check_header(d: Mapping[str, Any], kind: str | tuple[str, ...], required: tuple[str, ...] = ()) -> str:
    """``d``'s kind after checking it is (one of) ``kind``, of this latencylab's schema version, and holds the
    ``required`` keys; one-line :class:`LatencyLabError` otherwise."""
    kinds = (kind,) if isinstance(kind, str) else kind
    got = d.get("kind")
    if got not in kinds:
        raise LatencyLabError(f"not a {' or '.join(kinds)} result (kind={got!r})")
    version = d.get("schema_version")
    if version != kind_version(str(got)):
        raise LatencyLabError(
            f"unsupported schema_version {version!r} (this latencylab reads {kind_version(str(got))})"
        )
    missing = [k for k in required if k not in d]
    if missing:
        raise LatencyLabError(f"malformed {got} result: missing {', '.join(missing)}")
    return str(got)


@dataclass(frozen=True, slots=True)
class Document:
    """A result of a kind read by its keys (``capacity``, ``serve``, ``recipe``, ``diagnose``...)."""

    kind: str
    doc: Mapping[str, Any]

    @property
    def schema_version(self) -> int:
        return int(self.doc.get("schema_version", kind_version(self.kind)))

    @property
    def env(self) -> Mapping[str, Any]:
        return self.doc.get("env") or {}

    def to_dict(self) -> dict[str, Any]:
        return dict(self.doc)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Document:
        kind = str(d.get("kind"))
        check_header(d, kind)
        return cls(kind, dict(d))

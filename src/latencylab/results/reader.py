"""The one reader of result files: every consumer (diagnose, report, compare, ``load_result``) reads through it.

:func:`read_result` turns a path into a :class:`LoadedResult` (where it came from, its ``kind``, its JSON
document), with one-line :class:`~latencylab.errors.LatencyLabError` messages for a missing file, a file that
is not JSON, a document without a ``kind``, or a schema version this latencylab does not read. Profile
documents are parsed on the way in (every rule reads them as :class:`ProfileResult`); other kinds are
parsed when asked (:meth:`LoadedResult.result`, through the registry).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.files import read_json
from latencylab.results.registry import kind_version, parse

__all__ = ["LoadedResult", "loaded", "read_document", "read_result"]


@dataclass(frozen=True)
class LoadedResult:
    """A result file as the rules see it: where it came from, its ``kind`` ("profile", "load", "optimize",
    "serve", ...) and its parsed JSON document."""

    source: str
    kind: str
    doc: Mapping[str, Any]

    def result(self) -> Any:
        """The typed, frozen result (:func:`latencylab.results.registry.parse`)."""
        try:
            return parse(self.doc)
        except LatencyLabError as exc:
            raise LatencyLabError(f"{self.source}: {exc}") from exc


def read_document(path: str | Path) -> dict[str, Any]:
    """A result file's top-level JSON object, with one-line errors for a missing or unreadable file."""
    p = Path(path)
    data = read_json(p, "result file")
    if not isinstance(data, dict):
        raise LatencyLabError(f"{p}: not a latencylab result (top level is not an object)")
    return data


def loaded(doc: Mapping[str, Any], source: str) -> LoadedResult:
    """A parsed result document as the consumers see it (validates its kind and schema version; parses a
    profile). A document without ``schema_version`` is read as the current version."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise LatencyLabError(f"{source}: not a latencylab result (no 'kind')")
    version = doc.get("schema_version")
    if version is not None and version != kind_version(kind):
        raise LatencyLabError(
            f"{source}: unsupported schema_version {version!r} (this latencylab reads {kind_version(kind)})"
        )
    if kind == "profile":
        from latencylab.results.profile import ProfileResult

        try:
            ProfileResult.from_dict(doc)
        except LatencyLabError as exc:
            raise LatencyLabError(f"{source}: {exc}") from exc
    return LoadedResult(source=source, kind=kind, doc=doc)


def read_result(path: str | Path, accept: Collection[str] | None = None, reader: str = "latencylab") -> LoadedResult:
    """Read one result file; ``accept`` (optional) names the kinds the caller (``reader``, for the message)
    reads. Raises a one-line :class:`LatencyLabError` for a missing, malformed or unaccepted file."""
    p = Path(path)
    r = loaded(read_document(p), str(p))
    if accept is not None and r.kind not in accept:
        raise LatencyLabError(f"{p}: unknown result kind {r.kind!r}; {reader} reads {', '.join(accept)}")
    return r

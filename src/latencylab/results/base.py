"""What every result shares: the header (kind, schema version, creation time) and the atomic writer."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from latencylab.results.registry import kind_version

__all__ = ["header", "utc_now", "write_json"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def header(kind: str, created_at: str | None = None) -> dict[str, Any]:
    """The first keys of every result document: its ``schema_version``, ``kind`` and ``created_at``."""
    return {"schema_version": kind_version(kind), "kind": kind, "created_at": created_at or utc_now()}


def write_json(path: str | Path, doc: Any, default: Any = None) -> Path:
    """Write ``doc`` as indented JSON to ``path`` through a temporary name, so that a reader never sees half a
    result; parents are created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=default))
    tmp.replace(p)
    return p

"""Reading a TOML or JSON file the user named, or failing in one line that says which file and why.

``what`` names the file in the message ("budget file", "result file", "config file"): a missing file is
"PATH: no such <what>", an unreadable one "PATH: cannot read the <what> (<error>)", a malformed one
"PATH: not valid TOML (<parser message>)" or "PATH: not a JSON <what> (<error>)".
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError

__all__ = ["read_json", "read_toml"]


def _text(p: Path, what: str) -> str:
    if not p.is_file():
        raise LatencyLabError(f"{p}: no such {what}")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LatencyLabError(f"{p}: cannot read the {what} ({exc.__class__.__name__})") from None


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML document in ``path`` (one-line :class:`LatencyLabError` for a missing or malformed file)."""
    p = Path(path)
    text = _text(p, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LatencyLabError(f"{p}: not valid TOML ({exc})") from None


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value in ``path`` (one-line :class:`LatencyLabError` for a missing or malformed file)."""
    p = Path(path)
    text = _text(p, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LatencyLabError(f"{p}: not a JSON {what} ({exc.__class__.__name__})") from None

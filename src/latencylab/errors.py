"""Errors the CLI turns into one line on stderr and a non-zero exit."""

from __future__ import annotations


class LatencyLabError(Exception):
    """A user-facing error: bad input, missing file, unsupported option."""


class NotApplicable(LatencyLabError):
    """Raised by a candidate's build that finds it does not apply on this machine (e.g. a length router whose long
    member is never the faster): the search reports the candidate skipped, with this reason, not failed."""


class MissingDependencyError(LatencyLabError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"{module} is not installed: pip install 'latencylab[{extra}]'")
        self.module = module
        self.extra = extra


def require(module: str, extra: str) -> object:
    """Import an optional dependency lazily, or raise a one-line install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module, extra) from exc

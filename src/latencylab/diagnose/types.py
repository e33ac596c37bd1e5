"""Shim: ``Finding``/``Evidence`` moved to :mod:`latencylab.findings`, ``LoadedResult`` to
:mod:`latencylab.results`. Remove once nothing imports this path."""

from latencylab.findings import SEVERITIES, Evidence, Finding
from latencylab.results.reader import LoadedResult

__all__ = ["SEVERITIES", "Evidence", "Finding", "LoadedResult"]

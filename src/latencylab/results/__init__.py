"""Results: frozen, versioned, JSON-serialisable values, one class per kind, and the one reader.

* :mod:`~latencylab.results.registry`: every ``kind``, its schema version (with history) and its class.
* :mod:`~latencylab.results.reader`: :func:`read_result`, the one way a result file is read.
* :mod:`~latencylab.results.base`: the shared header and the atomic writer.
* one module per kind: :mod:`~latencylab.results.profile`, :mod:`~latencylab.results.optimize`,
  :mod:`~latencylab.results.optimize_gen`, :mod:`~latencylab.results.experiment`,
  :mod:`~latencylab.results.document` (kinds read by their keys);
  the ``load`` kind lives beside the generator (:class:`latencylab.load.results.LoadResult`).
"""

from __future__ import annotations

from latencylab.results.base import header, write_json
from latencylab.results.profile import ProfileResult, StageSeries, load_result
from latencylab.results.reader import LoadedResult, loaded, read_document, read_result
from latencylab.results.registry import KINDS, Result, kind_version, parse, register

__all__ = [
    "KINDS",
    "LoadedResult",
    "ProfileResult",
    "Result",
    "StageSeries",
    "header",
    "kind_version",
    "load_result",
    "loaded",
    "parse",
    "read_document",
    "read_result",
    "register",
    "write_json",
]

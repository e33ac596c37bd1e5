"""A ``--pipeline`` factory for optimize tests: the built-in vision adapter under another name."""

from __future__ import annotations

from typing import Any

from latencylab.optimize.adapters import VisionAdapter


class _Named(VisionAdapter):
    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": "digits CNN (from a --pipeline factory)"}


def make(batch_size: int = 1, seq_len: int | None = None) -> VisionAdapter:
    del seq_len
    return _Named(batch_size=batch_size)

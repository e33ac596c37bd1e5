from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never write to the user's cache unless they ask for a specific one."""
    if "LATENCYLAB_CACHE" not in os.environ:
        monkeypatch.setenv("LATENCYLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))

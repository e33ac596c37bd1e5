"""A private ``LATENCYLAB_CACHE`` for a fixture, seeded with the vision weights the user's cache already holds.

Fixtures that need the trained vision model (the ladder's res64 and res32 CNNs) point the workloads at a private
cache so that a test never writes into the user's. Empty, that cache makes each such fixture train the models
again (10-20 s per fixture on 2 cores). ``seeded`` copies the weights ``latencylab prepare`` built (the user's
cache is only read) so that the fixture loads them; where the user's cache has none, the fixture trains as before.
The cache key covers the model version, the training config and the data, so a copied file is only used where
training would have produced it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def seeded(path: Path) -> Path:
    """``path`` (created) holding copies of ``$LATENCYLAB_CACHE/vision/*.pt``; returns ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    user = os.environ.get("LATENCYLAB_CACHE")
    if not user:
        return path
    src, dst = Path(user).expanduser() / "vision", path / "vision"
    if not src.is_dir() or src.resolve() == dst.resolve():
        return path
    dst.mkdir(exist_ok=True)
    for f in sorted(src.glob("*.pt")):
        target = dst / f.name
        if not target.exists():
            tmp = dst / f".{f.name}.copying"
            shutil.copyfile(f, tmp)
            tmp.replace(target)  # whole or absent: a reader never sees half a file
    return path

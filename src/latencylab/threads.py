"""Torch's intra-op thread count, set for a block and restored after it (one place, so none is left changed)."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any


class TorchThreads:
    """``with TorchThreads(n):`` runs the block with torch's intra-op thread count at ``n`` and restores the
    count it found; ``set(m)`` changes it again inside the block. ``n`` None leaves the count as it is.

    Torch is not imported for this: when nothing imported it (``import_torch`` False), there is nothing to set
    and every call is a no-op.
    """

    def __init__(self, n: int | None = None, import_torch: bool = False) -> None:
        if import_torch:
            import torch  # noqa: F401  (registers it in sys.modules)
        self.torch: Any = sys.modules.get("torch")
        self.n = n
        self.saved: int | None = self.torch.get_num_threads() if self.torch is not None else None

    def set(self, n: int | None) -> None:
        if n is not None and self.torch is not None and self.torch.get_num_threads() != n:
            self.torch.set_num_threads(n)

    def restore(self) -> None:
        self.set(self.saved)

    def __enter__(self) -> TorchThreads:
        self.set(self.n)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()

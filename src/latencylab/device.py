"""Which device a torch model runs on: one check of a "cpu", "cuda" or "cuda:N" device name.

The vision workload, the server's variants and ``latencylab profile --device`` all ask the same question (is
the name well formed, and is that CUDA device there?) and give the same answers. torch is imported only when
a CUDA device is named.
"""

from __future__ import annotations

from typing import Any

from latencylab.errors import LatencyLabError, require

__all__ = ["check_device"]


def check_device(device: str, extra: str = "torch", what: str = "") -> str:
    """Normalise ``device`` ("cpu", "cuda" or "cuda:N", any case) and return it; a CUDA device must be visible
    to torch, else a one-line :class:`LatencyLabError`. ``extra``: the install hint if torch is missing;
    ``what``: a prefix for a malformed name's message ("vision: device must be ...")."""
    dev = device.strip().lower()
    if dev == "cpu":
        return dev
    if dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit()):
        torch: Any = require("torch", extra)
        if not torch.cuda.is_available():
            raise LatencyLabError(
                f"device {device!r} requested but torch sees no such CUDA device: CUDA is not available to torch"
            )
        index = int(dev[5:]) if ":" in dev else 0
        count = torch.cuda.device_count()
        if index >= count:
            raise LatencyLabError(
                f"device {device!r} requested but torch sees no such CUDA device: it sees {count} CUDA device(s)"
            )
        return dev
    prefix = f"{what}: " if what else ""
    raise LatencyLabError(f"{prefix}device must be cpu, cuda or cuda:N, got {device!r}")

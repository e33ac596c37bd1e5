"""Start latencylab's reference OIP server in its own process (so it never shares the generator's GIL)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


@contextmanager
def reference_server(*args: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "latencylab.load.reference_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening "):
            raise RuntimeError(f"reference server did not start: {line} {proc.stderr.read() if proc.stderr else ''}")
        yield line.split(" ", 1)[1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def drawn_service_times(url: str) -> np.ndarray:
    with urllib.request.urlopen(f"{url}/debug/service_times", timeout=10) as resp:
        return np.asarray(json.loads(resp.read()), dtype=np.int64)

"""The generative server's import path stays light: OpenTelemetry loads only when spans are exported."""

from __future__ import annotations

import subprocess
import sys


def test_the_gen_server_imports_no_opentelemetry_unless_it_traces() -> None:
    code = (
        "import sys\n"
        "import latencylab.genserve.app, latencylab.genserve.server\n"
        "from latencylab.serve.app import bind\n"  # what serve_in_thread / run_gen_server import to listen
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'torch')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout

"""The machine-noise precondition of tests/conftest.py: what it skips on, and what it says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import Noise, Watch


def test_require_skips_naming_the_test_the_judgement_and_each_figure_over_its_limit() -> None:
    noise = Noise(stolen=0.30, max_stall_ms=12.0, wake_late_ms=4.0, load=1.5, test="test_x")
    noise.require("anything loose", stolen=0.5, max_stall_ms=20.0, wake_late_ms=5.0)  # within every limit
    with pytest.raises(pytest.skip.Exception) as skipped:
        noise.require("a 10-ms timer", stolen=0.1, wake_late_ms=5.0)
    reason = str(skipped.value)
    assert reason.startswith("test_x: machine too noisy to judge a 10-ms timer (stolen time 30.0% > 10.0%)")
    assert "wake-up" not in reason.split(":")[1]  # only the figures over their limits are named as the cause
    with pytest.raises(pytest.skip.Exception, match=r"longest stall 12.0 ms > 10 ms; sleep wake-up lateness"):
        noise.require("a stall", max_stall_ms=10.0, wake_late_ms=2.0)


def test_watch_sees_the_thread_kept_off_the_cpu_by_other_processes() -> None:
    """One more spinning process than there are CPUs, while this thread spins too: the kernel keeps it waiting
    for a good share of the time (about half, on 2 CPUs), and the Watch says so."""
    cpus = os.cpu_count() or 1
    spin = "import time\nprint(flush=True)\nend = time.time() + 0.5\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE) for _ in range(cpus + 1)]
    try:
        for p in hogs:
            assert p.stdout is not None
            p.stdout.readline()  # it is spinning now (for 0.5 s)
        with Watch() as watch:
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
    finally:
        for p in hogs:
            p.wait(10)
    if watch.waited is None:
        pytest.skip("the kernel does not report run-queue waits (/proc/thread-self/schedstat)")
    assert watch.waited > 0.2, watch.describe()
    assert watch.describe().startswith("kept off the CPU")

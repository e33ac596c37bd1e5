"""tests/serial_lock.py: a serial test waits for the running shared ones, and holds new ones off until it ends.

flock locks belong to open files, so threads that each open the lock files contend like xdist's processes.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import serial_lock


@pytest.fixture
def run_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"selftest-{tmp_path.name}")
    monkeypatch.setattr(serial_lock.tempfile, "gettempdir", lambda: str(tmp_path))


def _holder(exclusive: bool, entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def run() -> None:
        with serial_lock.held(exclusive):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_serial_test_waits_for_the_shared_one_and_holds_the_next_off(run_env: None) -> None:
    entered = [threading.Event() for _ in range(3)]
    leave = [threading.Event() for _ in range(3)]
    shared = _holder(False, entered[0], leave[0])
    assert entered[0].wait(5)
    serial = _holder(True, entered[1], leave[1])
    assert not entered[1].wait(0.3)  # the shared test is still running
    later = _holder(False, entered[2], leave[2])
    assert not entered[2].wait(0.3)  # queued behind the waiting serial test, not beside it
    leave[0].set()
    shared.join(5)
    assert entered[1].wait(5) and not entered[2].is_set()
    assert not entered[2].wait(0.3)  # the serial test runs alone
    leave[1].set()
    serial.join(5)
    assert entered[2].wait(5)
    leave[2].set()
    later.join(5)


def test_shared_tests_run_side_by_side(run_env: None) -> None:
    entered = [threading.Event() for _ in range(2)]
    leave = threading.Event()
    threads = [_holder(False, e, leave) for e in entered]
    assert all(e.wait(5) for e in entered)
    leave.set()
    for t in threads:
        t.join(5)


def test_without_xdist_nothing_is_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    with serial_lock.held(True), serial_lock.held(True):  # would deadlock if it locked anything
        pass

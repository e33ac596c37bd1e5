"""The test files that may hold a serial test, for part 1 of scripts/run-tests.sh to collect (not all ~120).

A test is serial when tests/conftest.py's SERIAL or QUIET table names its file, when it asks for the
``machine_noise`` fixture, or when it says ``@pytest.mark.serial``. The last two are found by the text of each
file, so this is a superset. Part 2 checks the other way (tests/conftest.py, LATENCYLAB_PART1_FILES): a serial
test in a file not listed here fails the run, so none can be skipped silently by both parts.
Usage: python tests/serial_files.py   (prints the paths, relative to the repository root, one per line)
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKERS = ("machine_noise", "mark.serial")


def serial_files() -> list[str]:
    sys.path.insert(0, str(HERE))
    import conftest

    named = {key.split("::", 1)[0] for table in (conftest.SERIAL, conftest.QUIET) for key in table}
    found = {p.name for p in HERE.glob("test_*.py") if any(m in p.read_text() for m in MARKERS)}
    return sorted(f"tests/{name}" for name in named | found if (HERE / name).is_file())


if __name__ == "__main__":
    print("\n".join(serial_files()))

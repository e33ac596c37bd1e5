"""tests/xdist_order.py: part 2 hands the longest file to the next free worker and keeps the Ray modules together."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import xdist_order as xo

pytest.importorskip("xdist")


class Node:
    """What the scheduler sees of a worker: the indices it was sent, and whether it was told to shut down."""

    def __init__(self, name: str, handed: list[tuple[str, list[int]]]) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.handed = handed  # every node's units, in the order they were handed out
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(list(indices))
        self.handed.append((self.name, list(indices)))

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(table: dict[str, float]) -> Any:
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=True))  # fmt: skip
    return xo.make_scheduler(config, None, table=table)


COLLECTION = [
    "tests/test_a.py::t1", "tests/test_a.py::t2", "tests/test_a.py::t3", "tests/test_a.py::t4",
    "tests/test_b.py::t1",
    "tests/test_scaleout_ray.py::t1", "tests/test_scaleout_ray.py::t2",
    "tests/test_c.py::t1", "tests/test_c.py::t2",
    "tests/test_scaleout_serve.py::t1",
    "tests/test_d.py::t1",
]  # fmt: skip


def files(unit: list[int]) -> list[str]:
    return sorted({COLLECTION[i].split("::")[0] for i in unit})


def test_each_free_worker_takes_the_longest_file_and_the_ray_modules_go_together() -> None:
    table = {"tests/test_a.py": 3.0, "tests/test_b.py": 50.0, "tests/test_c.py": 10.0, "tests/test_d.py": 1.0,
             **dict.fromkeys(xo.GROUPS, 0.0), "tests/test_scaleout_ray.py": 20.0,
             "tests/test_scaleout_serve.py": 15.0}  # fmt: skip
    sched = scheduler(table)
    handed: list[tuple[str, list[int]]] = []
    nodes = [Node("gw0", handed), Node("gw1", handed)]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, COLLECTION)
    sched.schedule()
    done = 0
    while done < len(handed):  # each node finishes its units in turn; a nearly idle node gets the next one
        name, unit = handed[done]
        node = next(n for n in nodes if n.name == name)
        for i in unit:
            sched.mark_test_complete(node, i)
        done += 1
    order = [files(unit) for _, unit in handed]
    # the longest first (b, 50 s), then the Ray group (20 + 15 s, one unit on one worker), then by expected time:
    # not by number of tests (a has the most, and goes after c)
    assert order == [["tests/test_b.py"], ["tests/test_scaleout_ray.py", "tests/test_scaleout_serve.py"],
                     ["tests/test_c.py"], ["tests/test_a.py"], ["tests/test_d.py"]]  # fmt: skip
    assert sorted(i for _, unit in handed for i in unit) == list(range(len(COLLECTION)))  # each test once
    assert sched.tests_finished


def test_a_file_missing_from_the_table_counts_as_its_median() -> None:
    table = {"tests/test_a.py": 1.0, "tests/test_b.py": 5.0, "tests/test_c.py": 9.0}
    assert xo.expected_s("tests/test_new.py", table) == 5.0
    assert xo.longest_first(["tests/test_a.py", "tests/test_new.py", "tests/test_c.py"], table) == "tests/test_c.py"
    assert xo.longest_first(["tests/test_a.py", "tests/test_new.py"], table) == "tests/test_new.py"
    assert xo.expected_s("tests/test_x.py", {}) == 1.0
    group = xo.scope_of("tests/test_scaleout_serve.py::t")
    assert group == xo.scope_of("tests/test_scaleout_ray.py::u") != xo.scope_of("tests/test_load.py::t")
    table = {**dict.fromkeys(xo.GROUPS, 0.0), "tests/test_scaleout_ray.py": 4.0, "tests/test_scaleout_serve.py": 6.0}
    assert xo.expected_s(group, table) == 10.0  # the group's other files as if they took no time


def test_the_recorder_sums_each_files_phases_and_keeps_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/test_old.py": 2.0, "tests/test_a.py": 99.0}))
    rec = xo.DurationRecorder(path)
    for nodeid, d in [("tests/test_a.py::t1", 0.5), ("tests/test_a.py::t1", 1.25), ("tests/test_a.py::t2", 0.25),
                      ("tests/test_b.py::t[x::y]", 3.0)]:  # fmt: skip
        rec.add(nodeid, d)
    rec.write()
    assert json.loads(path.read_text()) == {"tests/test_a.py": 2.0, "tests/test_b.py": 3.0, "tests/test_old.py": 2.0}
    assert xo.load_table(tmp_path / "missing.json") == {}


def test_the_shipped_table_names_files_that_exist() -> None:
    table = xo.load_table()
    assert table, "tests/durations.json is missing or empty"
    root = Path(__file__).resolve().parents[1]
    assert all((root / f).is_file() for f in table), [f for f in table if not (root / f).is_file()]


def test_part_1_collects_every_file_that_can_hold_a_serial_test() -> None:
    import conftest
    from serial_files import serial_files

    listed = set(serial_files())
    assert {f"tests/{k.split('::')[0]}" for k in (*conftest.SERIAL, *conftest.QUIET)} <= listed
    assert "tests/test_load_pooled.py" in listed  # serial only through its machine_noise fixture
    assert "tests/test_vision.py" not in listed and "tests/test_scaleout_ray.py" not in listed

"""benchmarks/serve_handoff_trace.py patches a copy of src/ with marks at every hand-off: the patch must still apply
to the current server code, and the patched modules must still compile (the script itself runs a server)."""

from __future__ import annotations

import py_compile
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_handoff_trace as ht


def test_the_patch_applies_to_the_current_server_and_compiles(tmp_path: Path) -> None:
    src = ht.patched_copy(tmp_path)
    for rel in {p[0] for p in ht.PATCHES}:
        f = src / "latencylab" / rel
        assert "marks" in f.read_text(encoding="utf-8")
        py_compile.compile(str(f), doraise=True)
    assert (Path(ht.ROOT) / "src" / "latencylab" / "serve" / "app.py").read_text().count("LL_HANDOFF_TRACE") == 0


def test_a_stale_anchor_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ht, "PATCHES", [("serve/app.py", "this line is not in app.py\n", "x\n")])
    with pytest.raises(SystemExit, match="no longer applies"):
        ht.patched_copy(tmp_path)


def test_segments_split_a_request_into_its_hand_offs() -> None:
    # start 0, age 1 ms, body at 0.1 ms, decoded 0.2, pool 0.5-1.5, back on the loop 2.0; queue 1 ms, batch 0.5,
    # compute 2, post 0.1 (3.6 ms of batcher stages, ending at 5.6); handler resumes at 6.0, response at 6.2 ms
    ms = 1_000_000
    row = [
        0,
        1 * ms,
        0.1 * ms,
        0.2 * ms,
        0.5 * ms,
        1.5 * ms,
        2.0 * ms,
        0.001,
        0.0005,
        0.002,
        0.0001,
        6.0 * ms,
        6.2 * ms,
        0.0,  # preprocessed in its batch: no
    ]
    seg = {k: float(v[0]) for k, v in ht.segments([row]).items()}
    want = {"age": 1.0, "read": 0.1, "decode": 0.1, "to_pool": 0.3, "preprocess": 1.0, "to_loop": 0.5, "queue": 1.0,
            "batch": 0.5, "compute": 2.0, "post": 0.1, "to_handler": 0.4, "respond": 0.2, "total": 7.2}  # fmt: skip
    assert seg == pytest.approx(want)
    assert set(seg) == set(ht.SEGMENTS)
    assert np.isclose(sum(seg[k] for k in ht.SEGMENTS if k != "total"), seg["total"])


def test_segments_of_a_request_preprocessed_in_its_batch() -> None:
    # no pool marks; 1 ms of preprocessing on the compute thread inside its batch: it is reported as preprocess
    # (not as a wait for the handler), and the segments still add up to the total
    ms = 1_000_000
    marks = [0, 0, 0.1 * ms, 0.2 * ms, 0, 0, 0.2 * ms]
    row = [*marks, 0.001, 0.0005, 0.002, 0.0001, 5.0 * ms, 5.1 * ms, 0.001]
    seg = {k: float(v[0]) for k, v in ht.segments([row]).items()}
    assert seg["to_pool"] == 0.0 and seg["preprocess"] == pytest.approx(1.0) and seg["to_loop"] == 0.0
    assert seg["to_handler"] == pytest.approx(5.0 - 0.2 - 1.0 - 3.6)
    assert np.isclose(sum(seg[k] for k in ht.SEGMENTS if k != "total"), seg["total"])

"""diagnose on generative load results: token stalls (with their time ranges) and a queue building before
prefill, on synthetic results with a planted cause, and on a real run of the reference streaming server."""

from __future__ import annotations

import json
from pathlib import Path

from gen_synthetic import synthetic_gen_result
from latencylab.diagnose.engine import diagnose_results, loaded
from latencylab.load.arrivals import Constant
from latencylab.load.gen_client import gen_api
from latencylab.load.gen_runner import gen_load_test
from latencylab.load.generator import LoadConfig
from latencylab.load.prompts import Prompt
from servers import stream_server


def _findings(result, rule: str):  # type: ignore[no-untyped-def]
    doc = json.loads(json.dumps(result.to_dict()))
    return [f for f in diagnose_results([loaded(doc, "gen.json")]) if f.rule == rule]


def test_a_clean_stream_has_no_token_finding() -> None:
    res = synthetic_gen_result(seed=1)
    assert not _findings(res, "token-stalls") and not _findings(res, "ttft-queueing")


PAUSES = tuple((1.5 * k, 300.0) for k in range(1, 13))  # 300 ms every 1.5 s, from 1.5 s to 18 s


def test_server_wide_pauses_are_found_with_their_time_ranges() -> None:
    # 10 req/s, streams of 100 + 15 x 20 ms = 0.4 s: ~4 in flight, each held by every pause it meets: ~50 of
    # ~3,000 gaps stall, enough to be the ITL p99
    res = synthetic_gen_result(pauses=PAUSES, seed=2)
    (f,) = _findings(res, "token-stalls")
    assert f.details["kind"] == "shared" and "server-wide" in f.title and f.severity == "warning"
    assert "chunked prefill" in f.recommendation
    s = res.summary["tokens"]["stalls"]
    assert s["streams"] >= 20 and s["window_count"] <= len(PAUSES)
    # every window runs from the stalled gaps' earliest token (< 50 ms before the pause) to the pause's end
    ends = {round(p[0] + p[1] / 1e3, 3) for p in PAUSES}
    for w in s["windows"]:
        assert round(w["end_s"], 3) in ends and 0.3 <= w["duration_ms"] / 1e3 < 0.35, w
    ranged = [e for e in f.evidence if e.t_start_s is not None]
    assert len(ranged) == 5 and all(round(e.t_end_s, 3) in ends for e in ranged)  # type: ignore[arg-type]


def test_a_rare_stall_below_the_p99_is_not_a_finding() -> None:
    res = synthetic_gen_result(pauses=((8.0, 600.0),), seed=2)  # ~4 of ~3,000 gaps: visible, but not the p99
    assert 0 < res.summary["tokens"]["stalls"]["gaps"] < 10 and res.summary["tokens"]["stalls"]["window_count"] == 1
    assert not _findings(res, "token-stalls")


def test_ttft_growing_through_the_run_is_a_queue_before_prefill() -> None:
    res = synthetic_gen_result(ttft_growth_ms_per_s=30.0, seed=3)  # 100 ms -> ~700 ms over 20 s; gaps steady
    (f,) = _findings(res, "ttft-queueing")
    first, last = (float(e.value) for e in f.evidence[:2])
    assert first < 250 and last > 500 and f.evidence[0].t_start_s == 0.0
    assert "--find-capacity" in f.recommendation
    assert not _findings(res, "token-stalls")


def test_one_stream_at_a_time_stalls_on_the_reference_server(tmp_path: Path) -> None:
    # every 3rd stream pauses 300 ms once; at 4 req/s with 180-ms streams they rarely overlap
    with stream_server("--ttft", "constant(20ms)", "--gap", "constant(10ms)", "--stall-every", "3",
                       "--stall", "300ms") as url:  # fmt: skip
        res, _ = gen_load_test(url, gen_api("chat"), "reference", [Prompt("p", 16, None, "p")], Constant(4),
                               LoadConfig(duration_s=3, spin="off"), env={})  # fmt: skip
    path = res.save(tmp_path / "g.json")
    (f,) = [x for x in diagnose_results([loaded(json.loads(path.read_text()), str(path))]) if x.rule == "token-stalls"]
    stalls = res.summary["tokens"]["stalls"]
    planted = [w for w in stalls["windows"] if abs(w["duration_ms"] - 310) < 30]
    # each planted stall is found; a busy machine may add a wake-up hiccup of its own beside them
    assert len(planted) == res.summary["ok"] // 3 and all(w["streams"] == 1 for w in planted)
    assert f.details["kind"] == "single" and "one stream at a time" in f.title

"""The load generator against servers with known behaviour (all traffic on 127.0.0.1, bounded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import Watch
from latencylab.load.arrivals import Constant, Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import LoadResult, Slo
from latencylab.load.runner import load_test
from latencylab.workloads.synthetic import Distribution
from servers import drawn_service_times, recording_server, reference_server

PATH = infer_path("reference")


def _payloads(url: str) -> list:
    return payloads_for_model(fetch_metadata(url, "reference"), n=16)


@pytest.mark.slow
def test_percentiles_within_3pct_of_known_service_times(machine_noise) -> None:  # type: ignore[no-untyped-def]
    # Median 80 ms: loopback + HTTP overhead (~1 ms, reconciled below) stays well inside 3%.
    limits = {"stolen": 0.10, "wake_late_ms": 1.0}  # sends on time need timers that wake on time
    machine_noise.require("sends within 1 ms of their intended time", **limits)
    dist = Distribution.parse("lognormal(80ms,0.35)")
    with reference_server("--service", "lognormal(80ms,0.35)", "--seed", "3") as url:
        with Watch() as watch:  # the generator runs on this thread: how long the machine kept it off the CPU
            res, _ = load_test(url, PATH, _payloads(url), Poisson(90, seed=1), LoadConfig(duration_s=14), env={})
        drawn = drawn_service_times(url)
    s = res.summary
    assert s["sent"] == s["ok"] == drawn.size >= 1100
    busy = s["client_cpu_share"] + s["other_cpu_cores"]
    if busy >= 0.9 * s["client_cores"] and s["late_fraction"] >= 0.05:
        # Other processes held the cores (2 shared cores at load 5 saw 6-10% late sends, with the old always-spin
        # timing as with the new): the sends could not be on time, and latency from the intended send carries it.
        pytest.skip(f"cores saturated ({busy:.2f} of {s['client_cores']} busy): {s['late_fraction']:.1%} sends late")
    if s["late_fraction"] >= 0.05:
        # Two clean-clone CI runs saw 5.4% and 5.8% late with the cores not saturated. Here, quiet: 0.6-1.8% late
        # with the generator's thread kept off the CPU 2.2-3.0% of the run; beside two spinning processes: 12.5%
        # late, kept off 5.9%. Set aside when the machine kept the generator off the CPU (run-queue wait and
        # hypervisor steal, measured over the run itself), or turned noisy; otherwise the failure stands.
        if watch.waited is not None and watch.waited >= 0.04:
            pytest.skip(f"the generator's thread was {watch.describe()}: {s['late_fraction']:.1%} sends late")
        machine_noise.recheck("sends within 1 ms of their intended time", **limits)
    why = (s["late_fraction"], busy, watch.describe(), s["gc_pauses"], s["gc_pause_max_ms"], s["spin_fraction"])
    assert s["late_fraction"] < 0.05, why  # sends on time (the 1% validity bar is for quiet machines)
    for q, key in ((0.5, "p50_ms"), (0.99, "p99_ms")):
        realised = np.quantile(drawn, q) / 1e6
        assert s[key] == pytest.approx(realised, rel=0.03), (key, s[key], realised)
        assert s[key] == pytest.approx(dist.quantile(q) / 1e6, rel=0.06)  # sampling error of 1400 draws
    # The typical send is on time (~0.1 ms on a quiet machine). The tail belongs to the machine: a clean-clone
    # CI run saw 5.07 ms at p99 with 2 cores shared by the server, the generator and pytest. The percentile
    # agreement above is the claim that matters: latency counts from the intended send, lateness included.
    assert s["lateness_p50_ms"] <= 1.0
    assert s["lateness_p99_ms"] <= 0.05 * s["p99_ms"]  # a gross bound, scaled to the tail being measured
    # reconciliation: the server's own mean request time is within the client's mean, minus ~1 ms of loopback
    srv = res.server
    assert srv is not None and srv["server_requests"] == s["ok"]
    assert 0 <= srv["network_and_client_mean_ms"] < 3


@pytest.mark.slow
def test_open_loop_shows_a_stall_that_closed_loop_hides() -> None:
    args = ("--service", "constant(10ms)", "--stall-at", "1", "--stall", "600ms")
    with reference_server(*args) as url:
        open_res, _ = load_test(url, PATH, _payloads(url), Constant(50), LoadConfig(duration_s=3), env={})
    with reference_server(*args) as url:
        closed_res, _ = load_test(
            url, PATH, _payloads(url), None, LoadConfig(mode="closed", concurrency=1, duration_s=3), env={}
        )
    o, c = open_res.summary, closed_res.summary
    # Open loop: the ~30 requests due during the 0.6-s freeze all wait; ~20% of the 150 requests exceed 100 ms.
    assert o["p99_ms"] > 400
    assert o["p90_ms"] > 100
    # The open loop kept sending on time through the stall (the burst of 50 answers when it ends may
    # delay a send or two on a busy machine: allow a few percent, not the 1% validity bar).
    assert o["late_fraction"] < 0.2, o["invalid_reasons"]
    # Closed loop: the one user waits out the stall once; the other ~200 requests are fast.
    assert c["p99_ms"] < 50
    assert c["max_ms"] > 550  # the stall is there, hidden in a single sample
    assert c["mode"] == "closed (concurrency 1)"
    assert "closed loop" in c["coordinated_omission"]
    assert c["latency_basis"].startswith("closed loop: from actual send") and c["valid"] is None
    assert o["latency_basis"] == "from intended send"
    # Uncorrected (from actual send) figures of the open loop are what perf_analyzer-style timing would see.
    assert o["p99_ms"] >= o["uncorrected_p99_ms"]


def test_sent_equals_ok_plus_shed_plus_error_and_retry_after() -> None:
    with reference_server("--service", "constant(50ms)", "--max-inflight", "2") as url:
        res, rec = load_test(url, PATH, _payloads(url), Constant(200), LoadConfig(duration_s=1.5), env={})
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"] == rec.n
    assert s["shed"] > 0.5 * s["sent"]  # 200/s offered, ~40/s served
    assert s["ok"] > 0 and s["error"] == 0
    assert "corrected_shed" in res.histograms


def test_timeouts_are_errors_not_drops() -> None:
    with reference_server("--service", "constant(5ms)", "--stall-at", "0.2", "--stall", "3s") as url:
        res, _ = load_test(url, PATH, _payloads(url), Constant(20), LoadConfig(duration_s=1.0, timeout_s=0.5), env={})
    s = res.summary
    assert s["sent"] == s["ok"] + s["shed"] + s["error"]
    assert s["error"] >= 10
    assert any("timeout after 0.5 s" in r for r in s["errors_by_reason"])


def test_result_round_trips_and_histograms_merge_losslessly(tmp_path: Path) -> None:
    with reference_server("--service", "constant(2ms)") as url:
        a, _ = load_test(url, PATH, _payloads(url), Poisson(100, seed=1), LoadConfig(duration_s=1), env={})
        b, _ = load_test(url, PATH, _payloads(url), Poisson(100, seed=2), LoadConfig(duration_s=1), env={})
    p = a.save(tmp_path / "a.json")
    back = LoadResult.from_dict(json.loads(p.read_text()))
    assert back.summary == json.loads(json.dumps(a.summary))
    merged = back.histogram("corrected_ok")
    merged.merge(b.histogram("corrected_ok"))
    assert merged.count == a.summary["ok"] + b.summary["ok"]


def test_slo_verdict_and_early_abort() -> None:
    with reference_server("--service", "constant(30ms)", "--serial") as url:
        # 60/s offered to a server that does ~33/s: the queue grows, the SLO is violated and the run stops early.
        from latencylab.load.early_stop import EarlyStop

        slo = Slo.parse("p99=50ms")
        rule = EarlyStop(slo.q, 0.99)

        def abort(progress: object) -> str:
            return "violated" if rule(progress) else ""  # type: ignore[arg-type]

        res, _ = load_test(
            url,
            PATH,
            _payloads(url),
            Constant(60),
            LoadConfig(duration_s=10),
            slo=slo,
            abort_when=abort,
            env={},
        )
    s = res.summary
    assert s["stopped_early"] == "violated"
    assert s["sent"] < 500  # stopped at a look (2.5, 5 or 7.5 s), before 10 s x 60/s
    assert s["slo"]["verdict"] == "fail"
    assert s["sent"] == s["ok"] + s["shed"] + s["error"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "latencylab", "load", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_load_json_and_jsonl(tmp_path: Path) -> None:
    with reference_server("--service", "constant(3ms)") as url:
        p = _cli("--url", url, "--model", "reference", "--rate", "50", "--duration", "1", "--slo", "p99=100ms",
                 "--json", str(tmp_path / "r.json"), "--requests-jsonl", str(tmp_path / "r.jsonl"),
                 "--plot", str(tmp_path / "plots"), "--spin", "off")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"latencylab load: {url}{PATH} [open]" in p.stdout  # the mode label is not swallowed as markup
    assert "latency p99 (from intended send)" in p.stdout
    assert "spin off: 0% of sends busy-waited" in p.stdout
    d = json.loads((tmp_path / "r.json").read_text())
    s = d["summary"]
    for key in ("target_rate", "achieved_rate", "p50_ms", "p99_ms", "uncorrected_p50_ms", "uncorrected_p99_ms",
                "lateness_p99_ms", "sent", "ok", "shed", "error", "valid", "latency_basis", "client_cpu_share",
                "client_cores", "spin", "spin_fraction"):  # fmt: skip
        assert key in s, key
    assert s["target_rate"] == 50.0
    assert s["spin"] == "off" and s["spin_fraction"] == 0.0 and d["config"]["spin"] == "off"
    assert 0.0 <= s["client_cpu_share"] <= s["client_cores"]
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == s["sent"]
    assert json.loads(lines[0])["outcome"] == "ok"
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["latency_cdf.png", "latency_over_time.png"]


@pytest.mark.slow
def test_cli_capacity_search_brackets_a_single_worker_server(tmp_path: Path) -> None:
    # One worker, 5 ms per request: capacity 200/s at most; p99 <= 30 ms is met well below that.
    with reference_server("--service", "constant(5ms)", "--serial") as url:
        # a coarse bracket (precision 0.5, chunks of 0.75 s, at most 200/s): the CLI's wiring of the search, whose logic
        # tests/test_load_capacity_search.py checks on simulated queues and test_load_capacity_reference.py on a
        # real server against the M/D/1 truth
        p = _cli("--url", url, "--model", "reference", "--find-capacity", "--slo", "p99=30ms", "--start-rate", "80",
                 "--step-duration", "0.75", "--warmup", "0.15", "--max-chunks", "2", "--precision", "0.5",
                 "--max-rate", "200",
                 "--search-warmup", "1", "--spin", "on",
                 "--json", str(tmp_path / "c.json"), timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    cap = json.loads((tmp_path / "c.json").read_text())["capacity"]
    failed = [s["why"] for s in cap["steps"] if not s["passed"]]
    if (cap["capacity_rate"] or 0) < 10 and all("generator fell behind" in why for why in failed):
        # A step of 3 s at 20/s holds 60 sends: one sent >1 ms late is over the 1% limit. On 2 cores that other
        # processes keep busy (load 4-5) that happened at every rate, with the old always-spin timing as with
        # auto; the steps say so themselves, and the search bracketed the generator, not the server.
        pytest.skip(f"every failing step was the generator falling behind (a busy machine): {failed[0]}")
    assert 10 <= cap["capacity_rate"] <= 200  # ~120-170/s on a quiet machine; a busy one lowers it
    assert any(not s["passed"] for s in cap["steps"]) and any(s["passed"] for s in cap["steps"])
    assert "capacity:" in p.stdout


def test_cli_bad_inputs(tmp_path: Path) -> None:
    p = _cli("--url", "http://127.0.0.1:9", "--model", "m", "--rate", "5", "--duration", "1")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "cannot reach http://127.0.0.1:9" in p.stderr
    bad = tmp_path / "t.csv"
    bad.write_text("t_s,payload\n0.1,0\nnot-a-number,1\n")
    with reference_server("--service", "constant(1ms)") as url:
        p = _cli("--url", url, "--model", "nosuch", "--rate", "5", "--duration", "1")
        assert p.returncode == 2 and p.stderr.count("\n") == 1
        assert "does not know model 'nosuch'" in p.stderr
        p = _cli("--url", url, "--model", "reference", "--arrivals", f"trace:{bad}")
        assert p.returncode == 2 and p.stderr.count("\n") == 1
        assert "t.csv" in p.stderr and "3" in p.stderr
        p = _cli("--url", url, "--model", "reference", "--find-capacity")
        assert p.returncode == 2 and "needs --slo" in p.stderr
        p = _cli("--url", url, "--model", "reference", "--find-capacity", "--slo", "p99=30ms", "--refine-rounds", "-1")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "refine_rounds" in p.stderr
    p = _cli("--url", "ftp://x", "--model", "m")
    assert p.returncode == 2 and "must be an http://host:port URL" in p.stderr


def test_min_requests_extends_the_run() -> None:
    with reference_server("--service", "constant(1ms)") as url:
        res, rec = load_test(
            url, PATH, _payloads(url), Constant(20), LoadConfig(duration_s=0.5, min_requests=30), env={}
        )
    assert res.summary["sent"] == 30
    assert rec.intended_ns.max() == pytest.approx(29 / 20 * 1e9)


def test_cli_early_stop_when_the_slo_verdict_is_decided(tmp_path: Path) -> None:
    with reference_server("--service", "constant(1ms)") as url:
        p = _cli("--url", url, "--model", "reference", "--rate", "300", "--duration", "20", "--slo", "p99=1s",
                 "--early-stop", "--json", str(tmp_path / "e.json"))  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "e.json").read_text())["summary"]
    assert s["stopped_early"].startswith("early stop: SLO met with 99% confidence after")
    # 459 clean requests decide p99 at 99% confidence, ~550 at the 99.7% of one of three looks; the first look
    # is at 25% of the 20 s (~1500 sent)
    assert 550 <= s["ok"] < 2200
    assert s["slo"]["verdict"] == "pass"


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_request_start_header_states_the_intended_send_time(mode: str) -> None:
    """Each request's X-Request-Start is its intended send time in unix µs: the stamps are spaced exactly as
    the schedule (so they are the intended times, not the actual sends), and they lie within a few ms before
    the server read the request (same host clock)."""
    from latencylab.load.generator import Payload, run_load

    payloads = [Payload(b'{"inputs": []}'), Payload(b'{"inputs": [], "id": "a longer body"}')]
    closed = mode == "closed"
    cfg = LoadConfig(mode=mode, concurrency=2, duration_s=None if closed else 0.5, max_requests=40 if closed else None,
                     request_start_header=True)  # fmt: skip
    with recording_server() as (url, seen):
        rec, _ = run_load(url, "/v2/models/m/infer", payloads, None if closed else Constant(80), cfg)
        plain, _ = run_load(url, "/v2/models/m/infer", payloads, Constant(80), LoadConfig(duration_s=0.1))
    assert rec.n == len(seen) - plain.n and (rec.outcome == 0).all()
    stamped, unstamped = seen[: rec.n], seen[rec.n :]
    assert all(h is None for h, _ in unstamped)  # off by default
    assert all(h is not None and h.startswith("t=") and len(h) == 18 for h, _ in stamped)
    stamps_us = np.sort(np.array([int(h[2:]) for h, _ in stamped if h is not None], dtype=np.int64))
    intended_ns = np.sort(rec.intended_ns)
    # spacing: exactly the schedule's, to the µs (rounding of two stamps)
    assert np.abs((stamps_us - stamps_us[0]) - (intended_ns - intended_ns[0]) / 1000).max() <= 1
    # position: the server read each request a little after its stamp (loopback + generator lateness)
    read_after_ms = np.array([(t - int(h[2:]) * 1000) / 1e6 for h, t in stamped if h is not None])
    assert read_after_ms.min() > -1.0, read_after_ms.min()
    assert np.median(read_after_ms) < 5.0, np.median(read_after_ms)

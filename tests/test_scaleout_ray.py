"""Distributed load on a local 2-node Ray cluster started here (slow tier; part 2 runs this module and
test_scaleout_serve.py on one worker, one after the other: tests/xdist_order.py): the merged result is
lossless and one-host-shaped, a worker killed mid-run is reported with its samples up to the failure kept,
one worker's early stop stops the others, and ``--find-capacity --ray`` runs end to end."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from latencylab.cli import main
from latencylab.load.arrivals import Poisson
from latencylab.load.early_stop import Progress
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import LoadResult, Slo, new_histogram
from latencylab.scaleout.load_ray import LoadCluster
from servers import reference_server

# Not serial: no verdict here reads real time closely (the capacity search judges a median against 2.5x a
# 100-ms service; the rest count requests), so the modules run in part 2, one cluster at a time.
pytestmark = pytest.mark.slow
PATH = infer_path("reference")
QS = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LoadCluster, str, list]]:  # type: ignore[type-arg]
    import ray
    from ray.cluster_utils import Cluster

    # 2 Ray CPUs a node: the module's 2 workers take one on each, the CLI's capacity search the other two
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        with reference_server("--service", "constant(2ms)") as url:
            payloads = payloads_for_model(fetch_metadata(url, "reference"), n=4, seed=0)
            with LoadCluster(2, poll_s=0.5) as lc:
                yield lc, url, payloads
    finally:
        ray.shutdown()
        c.shutdown()


def test_two_nodes_merge_into_one_lossless_result(cluster) -> None:  # type: ignore[no-untyped-def]
    lc, url, payloads = cluster
    assert len(set(lc.nodes)) == 2  # one worker per node
    run = lc.run(url, PATH, payloads, Poisson(150.0, seed=4), LoadConfig(duration_s=3.0), Slo.parse("p99=500ms"),
                 keep_records=True)  # fmt: skip
    s = run.result.summary
    rows = s["workers"]
    assert [r["worker"] for r in rows] == [0, 1] and {r["node"] for r in rows} == set(lc.nodes)
    assert s["sent"] == sum(r["sent"] for r in rows) == s["ok"] + s["shed"] + s["error"]
    assert all(r["sent"] > 100 for r in rows)  # each drew its own share of 150/s for 3 s
    rec = run.records
    assert rec is not None and rec.n == s["sent"]
    ok = rec.outcome == 0
    one = new_histogram()
    one.record_many(np.maximum(rec.corrected()[ok], 1))
    merged = run.result.histogram("corrected_ok")
    assert merged.quantiles(QS) == one.quantiles(QS)  # merged percentiles = one histogram of all samples
    assert s["p99_ms"] == one.quantile(0.99) / 1e6
    assert s["distributed"]["failed_workers"] == []
    if not s["valid"]:  # a busy shared machine: then the reasons name the worker that fell behind
        assert all(r.startswith("worker ") for r in s["invalid_reasons"])
    again = LoadResult.from_dict(run.result.to_dict())
    assert again.summary["workers"] == rows and again.histogram("corrected_ok").quantiles(QS) == one.quantiles(QS)


def test_a_killed_worker_is_reported_with_its_samples_and_the_run_invalid(cluster) -> None:  # type: ignore[no-untyped-def]
    lc, url, payloads = cluster
    victim = lc.pids()[1]
    # the run starts start_lead_s (0.27 s) after it is asked for; kill the worker 2 s into its 5 s
    timer = threading.Timer(lc.start_lead_s + 2.0, os.kill, (victim, signal.SIGKILL))
    timer.start()
    try:
        run = lc.run(url, PATH, payloads, Poisson(100.0, seed=5), LoadConfig(duration_s=5.0))
    finally:
        timer.cancel()
    s = run.result.summary
    assert list(run.failures) == [1]
    assert s["valid"] is False
    assert any(r.startswith("worker 1 (") and "failed" in r for r in s["invalid_reasons"])
    dead, alive = s["workers"][1], s["workers"][0]
    assert dead["partial"] and dead["valid"] is False
    assert 0 < dead["sent"] < alive["sent"]  # its samples up to the last poll before the kill are kept
    assert s["sent"] == dead["sent"] + alive["sent"]
    assert s["distributed"]["failed_workers"] == [1]
    # the next run replaces the dead actor
    again = lc.run(url, PATH, payloads, Poisson(50.0, seed=6), LoadConfig(duration_s=1.0))
    assert again.failures == {} and all(r["sent"] > 0 for r in again.result.summary["workers"])


def test_more_workers_than_free_cpus_is_a_one_line_error(cluster) -> None:  # type: ignore[no-untyped-def]
    from latencylab.errors import LatencyLabError

    # the module's two workers hold 2 of the cluster's 4 CPUs: 3 more cannot be placed
    with pytest.raises(LatencyLabError, match="could not place 3 load workers"):
        LoadCluster(3, place_timeout_s=2.0).open()


def test_one_workers_early_stop_stops_the_others(cluster) -> None:  # type: ignore[no-untyped-def]
    lc, url, payloads = cluster
    victim = lc.pids()[1]

    def planted(p: Progress) -> str:  # only worker 1's rule fires, 1 s in (pickled by value to the actors)
        return "planted stop" if os.getpid() == victim and p.elapsed_s >= 1.0 else ""

    run = lc.run(url, PATH, payloads, Poisson(100.0, seed=7), LoadConfig(duration_s=8.0), abort_when=planted)
    s = run.result.summary
    assert s["distributed"]["stopped_by"] == 1 and s["stopped_early"] == "worker 1: planted stop"
    assert run.parts[1].summary is not None and run.parts[1].summary["stopped_early"] == "planted stop"
    assert run.parts[0].summary is not None
    assert run.parts[0].summary["stopped_early"] == "worker 1 stopped early (planted stop)"
    w0 = s["workers"][0]
    # worker 0 alone would send ~400 (50/s for 8 s); stopped by the driver's next poll (0.5 s) it sends ~60-100
    assert 0 < w0["sent"] < 0.6 * 400
    assert s["sent"] == s["ok"] + s["shed"] + s["error"]


def test_cli_find_capacity_on_ray_workers(cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    # One server worker, 100 ms a request: capacity 10/s. Two steps, each from 2 Ray workers on the module's
    # cluster (ray is initialised in this process): 7/s (load 0.7) passes; --max-rate 13.9/s (load 1.39: the queue
    # grows by ~0.4 s a second, so the median request of a 2-s chunk waits ~0.4 s: p50 ~0.5 s) fails. 1-s chunks
    # left it at the edge (median wait ~0.2 s: a Poisson dip to 12.5/s measured p50 206 ms, a pass, in a CI run);
    # the bracket (13.9 / 7 - 1 = 0.99) is within --precision 0.99, so no bisection (and an undecided 13.9/s is the
    # maximum rate). The SLO is
    # on the median, which a few dozen requests decide (a p99 of so few is their maximum). A chunk is kept with up
    # to 20% late sends (a busy 2-vCPU machine: a late send counts from its intended time, so it can only make a
    # step fail, and 13.9/s must fail anyway).
    caplog.set_level(logging.INFO, logger="latencylab.scaleout")
    out = tmp_path / "c.json"
    with reference_server("--service", "constant(100ms)", "--serial") as url:
        rc = main(["load", "--url", url, "--model", "reference", "--find-capacity", "--slo", "p50=250ms",
                   "--start-rate", "7", "--max-rate", "13.9", "--precision", "0.99", "--step-duration", "2",
                   "--warmup", "0.2", "--search-warmup", "0", "--max-chunks", "3", "--max-late", "0.2",
                   "--confidence", "0.9", "--ray", "--workers", "2", "--json", str(out)])  # fmt: skip
    assert rc == 0
    assert any("2 load workers on" in r.getMessage() for r in caplog.records)  # the steps ran on the actors
    cap = json.loads(out.read_text())["capacity"]
    steps = {st["offered_rate"]: st for st in cap["steps"]}
    assert sorted(steps) == [7.0, 13.9], cap["steps"]
    if any(st["verdict"] == "invalid" for st in steps.values()):
        pytest.skip(f"the generator fell behind on over 20% of a step's sends (a busy machine): {cap['steps']}")
    assert steps[7.0]["passed"] and not steps[13.9]["passed"], cap["steps"]
    assert 100 < steps[7.0]["p50_ms"] <= 250 < steps[13.9]["q_ms"]  # the median: 100 ms of service + the queue
    # decided (bracketed) or, when 3 chunks leave the failure undecided, judged on its median at the maximum rate
    assert cap["capacity_rate"] == 7.0 and cap["reason"].startswith(("bracketed", "still passing (or undecided)"))

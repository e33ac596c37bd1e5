"""Distributed load on a local 2-node Ray cluster started here (slow tier): the merged result is lossless and
one-host-shaped, and a worker killed mid-run is reported with its samples up to the failure kept."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("ray")

from latencylab.load.arrivals import Poisson
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import LoadResult, Slo, new_histogram
from latencylab.scaleout.load_ray import LoadCluster
from servers import reference_server

pytestmark = pytest.mark.slow
PATH = infer_path("reference")
QS = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LoadCluster, str, list]]:  # type: ignore[type-arg]
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
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
    # the run starts start_lead_s (1 s) after it is asked for; kill the worker 2 s into its 5 s
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

    # the module's two workers hold both CPUs of the cluster: a third cannot be placed
    with pytest.raises(LatencyLabError, match="could not place 1 load workers"):
        LoadCluster(1, place_timeout_s=2.0).open()

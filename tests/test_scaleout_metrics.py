"""Per-replica Prometheus expositions of ``serve --ray``: labelled by replica, merged into one (fast tier)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from latencylab.scaleout.serve_ray import merge_expositions, relabel
from latencylab.serve.metrics import ServerMetrics


def test_relabel_and_merge_keep_every_sample_once_per_replica() -> None:
    text = '# HELP a_total x\n# TYPE a_total counter\na_total{m="f"} 3.0\n# HELP b x\n# TYPE b gauge\nb 1.0\n'
    assert relabel(text, "r1").splitlines()[2] == 'a_total{replica="r1",m="f"} 3.0'
    assert relabel(text, "r1").splitlines()[5] == 'b{replica="r1"} 1.0'
    merged = merge_expositions({"r1": text, "r2": text})
    assert merged.count("# TYPE b gauge") == 1
    assert 'b{replica="r1"} 1.0' in merged and 'b{replica="r2"} 1.0' in merged


def test_two_replicas_real_expositions_merge_into_one_family_each_with_the_same_buckets() -> None:
    a, b = ServerMetrics({"m": 0.1}), ServerMetrics({"m": 0.1})
    a.observe_stages("m", [("request", 0.004)])
    b.observe_stages("m", [("request", 0.2), ("request", 0.03)])
    merged = merge_expositions({"r1": a.exposition().decode(), "r2": b.exposition().decode()})
    fams = [f for f in text_string_to_metric_families(merged) if f.name == "latencylab_server_stage_seconds"]
    assert len(fams) == 1
    count = {s.labels["replica"]: s.value for s in fams[0].samples if s.name.endswith("_count")}
    assert count == {"r1": 1.0, "r2": 2.0}
    les = {r: [s.labels["le"] for s in fams[0].samples if s.name.endswith("_bucket") and s.labels["replica"] == r]
           for r in ("r1", "r2")}  # fmt: skip
    assert les["r1"] == les["r2"] and len(les["r1"]) > 3  # the same buckets: the cluster's histogram is their sum

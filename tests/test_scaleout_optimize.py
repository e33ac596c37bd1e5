"""``optimize --ray`` on a local 2-node Ray cluster started here (slow tier; run with the other local-cluster
modules, one at a time: tests/xdist_order.py): the builds run on both nodes, the figures that do not depend
on time (statuses, fidelity) equal a one-process search's, every candidate is opened and timed here, the torch
family is built here (nothing to ship), a dead build worker's candidate is built again on another, and the CLI
runs it."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from latencylab.cli import main
from latencylab.optimize.lab import LabConfig, lab_candidates, make_context, prepare_context, run_lab
from latencylab.optimize.search import Budget
from latencylab.scaleout.optimize_ray import BuildCluster, search_on_ray
from onnx_models import deep_mlp
from ray_cluster import local_cluster

pytestmark = pytest.mark.slow
ONLY = ("ort-fp32", "ort-int8-dynamic-perchannel", "ort-int8-static-minmax", "torch-int8-dynamic")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with local_cluster(cpus_per_node=1) as address:  # one build worker a node
        yield address


def _fidelity(doc: dict) -> dict:  # type: ignore[type-arg]
    return {c["name"]: (c["status"], c["fidelity"], {k: v["fidelity"] for k, v in (c.get("sets") or {}).items()})
            for c in doc["candidates"]}  # fmt: skip


def test_builds_spread_over_both_nodes_and_agree_with_one_process(cluster: str, tmp_path: Path) -> None:
    one = run_lab(LabConfig(workload="vision", only=ONLY, rounds=2, time_budget_s=None), workdir=tmp_path / "one")
    cfg = LabConfig(workload="vision", only=ONLY, rounds=2, time_budget_s=None, ray="", workers=2)
    doc = run_lab(cfg, tmp_path / "out", workdir=tmp_path / "two")
    assert _fidelity(doc) == _fidelity(one)  # the same variants, the same outputs, wherever they were built
    d = doc["summary"]["distributed"]
    assert len({b["node_id"] for b in d["builders"]}) == 2  # one worker on each node
    per = d["candidates"]
    assert set(per) == {"torch-fp32", *ONLY}
    assert d["built_here"] == ["torch-fp32", "torch-int8-dynamic"]  # a module in memory: built where it is timed
    assert all(per[n]["worker"] is None and per[n]["shipped_bytes"] == 0 for n in d["built_here"])
    shipped = [p for n, p in per.items() if n not in d["built_here"]]
    assert {p["node_id"] for p in shipped} == {b["node_id"] for b in d["builders"]}  # both workers built
    assert d["timing_node"]["node_id"] in {b["node_id"] for b in d["builders"]}  # the head: this process's node
    for name in ONLY[1:3]:  # the quantised graphs came back as files and were opened here, not rebuilt
        assert per[name]["shipped_bytes"] > 0 and per[name]["fidelity_on"] == "builder"
        assert per[name]["check_max_rel"] <= 1e-4
    timed = {c["name"]: c["n"] for c in doc["candidates"]}
    assert all(n > 0 for n in timed.values()), timed  # every built candidate timed here, in the rounds
    assert d["build_phase_s"] > 0 and d["builds_sum_s"] > 0
    if doc["summary"]["chosen"] is not None:  # the export reads the shipped file under the driver's work dir
        assert Path(doc["artifact"]).exists() and json.loads(Path(doc["recipe"]).read_text())["candidate"]


def test_fallbacks_sharing_a_ranking_build_one_after_the_other(cluster: str, tmp_path: Path) -> None:
    only = ("ort-int8-dynamic-fallback-k2", "ort-int8-dynamic-fallback-k4")
    model = str(deep_mlp(tmp_path / "deep.onnx"))
    one = run_lab(LabConfig(workload="onnx", model_path=model, only=only, rounds=2, time_budget_s=None),
                  workdir=tmp_path / "one")  # fmt: skip
    cfg = LabConfig(workload="onnx", model_path=model, only=only, rounds=2, time_budget_s=None, ray="", workers=2)
    doc = run_lab(cfg, workdir=tmp_path / "two")
    assert _fidelity(doc) == _fidelity(one)
    assert {c["name"]: c["status"] for c in doc["candidates"]}[only[1]] != "failed", doc["candidates"]
    per = doc["summary"]["distributed"]["candidates"]
    k2, k4 = per[only[0]], per[only[1]]
    assert k4["started_s"] >= k2["ended_s"]  # held back while k2 made the ranking (both workers were free)
    ranking = [n for n in (tmp_path / "two" / "ort").iterdir() if n.name.startswith("sensitivity-")]
    assert len(ranking) == 1  # one ranking, made once, shipped back and forwarded with k4


def test_a_dead_build_workers_candidate_is_built_again_on_another(cluster: str, tmp_path: Path) -> None:
    import ray

    cfg = LabConfig(workload="vision", only=ONLY[:3], rounds=2, time_budget_s=None, ray="", workers=2)
    budget = Budget.parse("accuracy_drop<=1%")
    ctx = make_context(cfg, tmp_path / "work")
    prepare_context(ctx, cfg, budget)
    ctx.fp32_onnx()
    cl = BuildCluster(2)
    cl.open(cfg, budget.text, {})
    victim = cl.where[1]
    os.kill(int(victim["pid"]), signal.SIGKILL)  # a crash (its node lost): worker 1 gets the second candidate
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(cl.actors[1].where.remote(), timeout=30)
    res, dist = search_on_ray(ctx, cfg, lab_candidates(ctx, cfg), budget, cluster=cl)
    assert [r.status for r in res.candidates if r.status in ("failed", "skipped")] == []
    retried = [n for n, r in ((r.name, r) for r in res.candidates) if r.stats.get("retried_after")]
    assert len(retried) == 1 and "build worker 1 died" in res.by_name(retried[0]).stats["retried_after"][0]
    assert dist["candidates"][retried[0]]["worker"] == 0
    assert all(len(r.samples_ns) > 0 for r in res.candidates)  # every candidate timed, the retried one too


def test_cli_runs_the_search_on_ray(cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = ["optimize", "--workload", "vision", "--only", "ort-fp32", "--rounds", "2", "--quiet", "--json", str(out),
            "--ray", cluster, "--workers", "2"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["config"]["ray"] == cluster and doc["summary"]["distributed"]["workers"] == 2
    assert {c["name"]: c["status"] for c in doc["candidates"]}["ort-fp32"] in ("inside-budget", "outside-budget")

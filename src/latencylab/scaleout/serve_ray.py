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
  replica's own admission still refuses what it cannot finish by the deadline (503 + Retry-After);
  that refusal goes to the client, it is not retried on another replica (docs/scale.md says why).
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

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.serve.config import ServerConfig

INSTALL_HINT = "serve --ray needs Ray Serve: pip install 'latencylab[ray]'"
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


class OipReplica:
    """One replica: latencylab's server state behind the OIP app (module docstring). Wrapped by
    ``serve.ingress()`` in :func:`deploy`; the app is built after the constructor
    (``__serve_build_asgi_app__``), and Ray Serve runs its lifespan (the batchers start there)."""

    def __init__(self, cfg: ServerConfig, app_name: str, push_s: float = 1.0) -> None:
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
        self._stop = threading.Event()
        self._pusher = threading.Thread(target=self._push, args=(push_s,), name="metrics-push", daemon=True)
        self._pusher.start()

    def _push(self, every_s: float) -> None:
        import ray

        board = None
        while not self._stop.is_set():
            try:
                board = board or ray.get_actor(BOARD, namespace=self.app_name)
                board.put.remote(self.replica, self.state.metrics.exposition().decode())
            except Exception:  # no board (a deployment made without one) or it restarted: try again later
                board = None
            self._stop.wait(every_s)

    def pid(self) -> int:
        """This replica's process (a test kills one)."""
        import os

        return os.getpid()

    def replica_id(self) -> str:
        return self.replica

    def __serve_build_asgi_app__(self) -> Any:
        from starlette.responses import Response

        from latencylab.serve.app import lifespan_app

        inner = lifespan_app(self.state)
        own = self

        async def app(scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path", "") if scope["type"] == "http" else ""
            if path == "/metrics":
                text = relabel(own.state.metrics.exposition().decode(), own.replica)
                await Response(text, media_type=PROM)(scope, receive, send)
            elif path == "/metrics/cluster":
                await Response(await own._cluster_text(), media_type=PROM)(scope, receive, send)
            else:
                await inner(scope, receive, send)

        return app

    async def _cluster_text(self) -> str:
        import ray

        texts: dict[str, str] = {}
        with contextlib.suppress(Exception):  # no board: this replica's own view
            texts = await ray.get_actor(BOARD, namespace=self.app_name).all.remote()
        texts[self.replica] = self.state.metrics.exposition().decode()  # its own, fresh
        return merge_expositions(texts)

    def __del__(self) -> None:
        self._stop.set()


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise LatencyLabError(INSTALL_HINT) from None
    return serve


def deploy(cfg: ServerConfig, opts: ReplicaOptions, address: str | None = None) -> str:
    """Start (or join) Ray, Ray Serve's proxy on ``opts.host:opts.port``, the metrics board and ``opts.replicas``
    replicas of ``cfg``; returns the endpoint URL once every replica is ready (blocking: the replicas load and
    warm their models)."""
    if opts.replicas < 1:
        raise LatencyLabError("--replicas must be >= 1")
    serve = _serve()
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 namespace=opts.app_name)  # fmt: skip
    serve.start(http_options={"host": opts.host, "port": opts.port}, proxy_location=opts.proxy_location)
    try:
        ray.get_actor(BOARD, namespace=opts.app_name)
    except ValueError:
        ray.remote(num_cpus=0)(MetricsBoard).options(name=BOARD, namespace=opts.app_name, lifetime="detached").remote()
    actor: dict[str, Any] = {"num_cpus": opts.num_cpus}
    if opts.runtime_env:
        actor["runtime_env"] = dict(opts.runtime_env)
    deployment = serve.deployment(
        serve.ingress()(OipReplica),
        name=DEPLOYMENT,
        num_replicas=opts.replicas,
        max_ongoing_requests=opts.max_ongoing_requests,
        ray_actor_options=actor,
        health_check_period_s=2,
    )
    serve.run(deployment.bind(cfg, opts.app_name, opts.push_s), name=opts.app_name, route_prefix="/")
    return f"http://{opts.host}:{opts.port}"


def handle(opts: ReplicaOptions) -> Any:
    """The deployment's handle (calls its methods, e.g. ``pid``, on a replica the router picks)."""
    return _serve().get_deployment_handle(DEPLOYMENT, app_name=opts.app_name)


def shutdown(opts: ReplicaOptions) -> None:
    """Delete the application and the board (Ray itself is left to whoever started it)."""
    serve = _serve()
    import ray

    with contextlib.suppress(Exception):
        serve.delete(opts.app_name)
    with contextlib.suppress(Exception):
        ray.kill(ray.get_actor(BOARD, namespace=opts.app_name))
    serve.shutdown()

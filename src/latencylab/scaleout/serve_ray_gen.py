"""``latencylab serve --model gen --ray [ADDRESS] --replicas N``: the generative server in each Ray Serve replica.

Each replica (:class:`GenReplica`, ``num_cpus`` Ray CPUs) builds what ``latencylab serve --model gen`` builds
(``genserve.server.build_service``: the model loaded and warmed, the continuous-batching scheduler, admission,
the TTFT guard and its ladder) and serves the same Starlette app (``genserve.app.lifespan_gen_app``) as its
ASGI ingress; Ray Serve runs its lifespan, which starts the step thread. The OpenAI-compatible routes
(``/v1/completions``, ``/v1/chat/completions``, streamed as server-sent events through Ray Serve's proxy), the
OIP generate routes, health and metadata reach the client unchanged. ``/metrics`` and ``/metrics/cluster`` are
as for the OIP replicas (:class:`~latencylab.scaleout.serve_ray.PushedMetrics`).

What the OIP replicas have and these do not (yet): the retry of a shed request on another replica (a streamed
answer cannot be held whole and replayed) and ``--autoscale`` (the SLO pressure is the OIP batcher's).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.scaleout.serve_ray import PushedMetrics

DEPLOYMENT = "gen"


def _factory(spec: str) -> Any:
    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise LatencyLabError(f"service factory {spec!r} is not module:function")
    return getattr(importlib.import_module(mod), fn)


class GenReplica(PushedMetrics):
    """One replica: latencylab's generative service behind its app (module docstring). ``factory``
    ("module:function", called with no argument, returning a warmed ``GenService``) replaces the SmolLM2 service
    (a user's own engine; the tests' fake one)."""

    def __init__(self, cfg: Any, app_name: str, push_s: float = 1.0, factory: str | None = None) -> None:
        from ray import serve

        from latencylab.genserve.server import build_service, token_of

        if cfg.threads is not None:
            with contextlib.suppress(ImportError):
                import torch

                torch.set_num_threads(cfg.threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.app_name = app_name
        self.svc = _factory(factory)() if factory else build_service(cfg)
        self.token = token_of(cfg)
        self._start_push(push_s)

    def exposition(self) -> str:
        return str(self.svc.metrics.exposition().decode())

    def pid(self) -> int:
        import os

        return os.getpid()

    def __serve_build_asgi_app__(self) -> Any:
        from latencylab.genserve.app import lifespan_gen_app

        inner = lifespan_gen_app(self.svc, self.token)
        own = self

        async def app(scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path", "") if scope["type"] == "http" else ""
            if not await own.metrics_route(path, scope, receive, send):
                await inner(scope, receive, send)

        return app

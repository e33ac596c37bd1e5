"""The request router of ``serve --ray`` replicas: power of two choices over every replica.

Ray Serve's default router (``PowerOfTwoChoicesRequestRouter``) first tries the replicas on the proxy's own
node and goes elsewhere only when those are full (``max_ongoing_requests`` in flight). With one proxy on the
head node that sends every request to the head's replica until it holds ``max_ongoing_requests``: the other
replicas idle while the head's queue grows past what its admission accepts, and it sheds. Seen here on 2
replicas (tests/test_scaleout_serve.py, default router): 63 of 63 concurrent requests went to one replica.
This router drops the node preference: two replicas sampled from all, the shorter queue wins.

Imported by Ray Serve (in the proxy and in handles) from the deployment's ``RequestRouterConfig``. Ray 2.60
exports the mixins but not the default router itself, so it comes from its private module (pinned version).
"""

from __future__ import annotations

from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

PATH = "latencylab.scaleout.serve_router:SpreadRouter"


class SpreadRouter(PowerOfTwoChoicesRequestRouter):
    """Power of two choices over all replicas, whatever node the proxy is on."""

    def apply_locality_routing(self, pending_request: Any = None) -> set[Any]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # as Ray's own fallback to all replicas
        return set(self._replica_id_set)

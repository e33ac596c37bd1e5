"""A local multi-node Ray cluster for the scale-out tests: started, joined by this process, torn down after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def local_cluster(cpus_per_node: int, nodes: int = 2, namespace: str | None = None) -> Iterator[str]:
    """``nodes`` Ray nodes of ``cpus_per_node`` logical CPUs on this machine; yields the cluster's address."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    for _ in range(nodes - 1):
        c.add_node(num_cpus=cpus_per_node)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             namespace=namespace)  # fmt: skip
    try:
        yield c.address
    finally:
        ray.shutdown()
        c.shutdown()

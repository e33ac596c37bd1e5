"""Argument types and parsing helpers shared by the subcommands' parsers (each one-line on a bad value)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from latencylab.errors import LatencyLabError

__all__ = [
    "add_otlp_argument",
    "add_ray_arguments",
    "fraction",
    "non_negative_int",
    "otlp_endpoint",
    "params",
    "positive_float",
    "positive_int",
]


def params(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise LatencyLabError(f"--param {p!r} must look like key=value")
        out[key.strip()] = value
    return out


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{text} must be >= {low}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return v


def fraction(text: str) -> float:
    v = positive_float(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in (0, 1), e.g. 0.99")
    return v


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]`` and ``--workers N``: distributed load generation (latencylab.scaleout)."""
    parser.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="generate the load from Ray actors (pip install 'latencylab[ray]'): ADDRESS of a running cluster "
        "(ray://... or HOST:PORT), or none for RAY_ADDRESS / a local Ray instance",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=positive_int, default=None,
        help="with --ray: N generator actors (one CPU each, spread over the nodes); the arrival process is split "
        "so that their union is the one asked for (default 2)",
    )  # fmt: skip


def otlp_endpoint(text: str) -> str:
    """An OTLP/HTTP traces URL: http(s)://host[:port]/path."""
    from urllib.parse import urlsplit

    u = urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL, e.g. http://127.0.0.1:4318/v1/traces")
    return text


def add_otlp_argument(parser: argparse.ArgumentParser) -> None:
    """``--otlp-endpoint URL``: export a span per request over OTLP/HTTP (serve, both the OIP and the gen server)."""
    parser.add_argument(
        "--otlp-endpoint", type=otlp_endpoint, default=None, metavar="URL",
        help="export an OpenTelemetry span per request (with its stages as children) over OTLP/HTTP to URL, "
        "e.g. http://127.0.0.1:4318/v1/traces (default: no tracing)",
    )  # fmt: skip


def add_optimize_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``optimize --ray [ADDRESS] --workers N``: the builds and fidelity runs on Ray (latencylab.scaleout)."""
    parser.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="build and check the candidates on Ray workers (pip install 'latencylab[ray]'); latency is still "
        "measured here, on this node: ADDRESS of a running cluster, or none for RAY_ADDRESS / a local Ray instance",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=positive_int, default=None,
        help="with --ray: N build workers (--threads Ray CPUs each, spread over the nodes; default 2)",
    )  # fmt: skip


def replica_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` replicas, 1 <= MIN <= MAX."""
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX, e.g. 1:4") from None
    if not sep or not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= MIN <= MAX, e.g. 1:4")
    return a, b


def add_serve_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``serve --ray [ADDRESS] --replicas N``: the model service in N Ray Serve replicas (latencylab.scaleout)."""
    parser.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="serve from Ray Serve replicas behind Ray Serve's HTTP proxy (pip install 'latencylab[ray]'): ADDRESS "
        "of a running cluster, or none for RAY_ADDRESS / a local Ray instance",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=positive_int, default=None,
        help="with --ray: N replicas, each with the whole service (batcher, admission, guard, ladder, cache) and "
        "--threads (default 1) Ray CPUs (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--autoscale", type=replica_range, default=None, metavar="MIN:MAX",
        help="with --ray: let Ray Serve scale the replicas between MIN and MAX on their SLO pressure (predicted "
        "latency and window P99 over the SLO; docs/scale.md); --replicas is the initial count",
    )  # fmt: skip
    parser.add_argument(
        "--retry-shed", type=int, default=None, metavar="N",
        help="with --ray: a request a replica sheds (503) is offered to another replica up to N times before the "
        "client gets the 503 (default 0: off)",
    )  # fmt: skip

"""Free TCP ports for test servers (the OS picks them)."""

from __future__ import annotations

import contextlib
import socket

HOST = "127.0.0.1"


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago (the OS picks them).

    The sockets are held open together so that the n ports differ; another process may still take
    one before the server binds it, which start-up then reports with the server's log.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]


def free_port() -> int:
    """One TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]

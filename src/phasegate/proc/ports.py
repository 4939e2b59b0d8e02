"""Whether a range of TCP ports is free on this machine: each port bound, then let go.

The store keeps which ranges workflows hold (``phasegate.store.ports``); this
module only asks the operating system, so a range a program outside
phasegate listens on is never handed to a worktree.
"""

from __future__ import annotations

import socket

__all__ = ["PORT_RANGE", "range_is_free"]

#: The ports ranges are taken from, ``[first, end)``: below Linux's ephemeral
#: range (32768-60999), where the kernel picks outgoing connections' ports, and
#: above the well-known and most registered services' ports.
PORT_RANGE = (20000, 32768)


def range_is_free(base: int, count: int) -> bool:
    """Whether TCP ports ``base`` .. ``base + count - 1`` can each be bound on every
    IPv4 address of this machine now (no SO_REUSEADDR: a port still in TIME_WAIT
    counts as taken). Every socket is closed before returning."""
    sockets: list[socket.socket] = []
    try:
        for port in range(base, base + count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("0.0.0.0", port))
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
    return True

"""Loopback ports for servers that must be told theirs before they start.

``tritonserver``, ``tensorflow_model_server`` and ``redis-server`` take a port flag and
cannot report a port they chose themselves. A port found free by binding port 0 comes from
the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), the range every
outgoing connection also draws its local port from: between the pick and the server's own
bind, a client connection elsewhere (a test suite opens thousands) could take it, and the
server failed with "address already in use" (seen on fresh clones). So ports are drawn at
random below that range, never twice by one process, and checked free; a launcher whose
server still fails to bind picks again (:func:`address_in_use` reads its log).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["address_in_use", "free_port"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below this, well-known services are more likely
_given: set[int] = set()
_lock = threading.Lock()
_rng = random.SystemRandom()  # not the global generator: two processes must not walk alike

# what tritonserver, grpc, redis and Python's socket say when a port is taken
_IN_USE = (
    "address already in use",
    "address in use",
    "already in use",
    "failed to bind",
    "unable to bind",
    "couldn't bind",
    "failed to add port",
    "errno 98",
)


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range where there is room below
    it, and not given out before by this process."""
    top = _ephemeral_low()
    with _lock:
        if top - _LOWEST >= 1000:
            for _ in range(200):
                port = _rng.randrange(_LOWEST, top)
                if port not in _given and _bindable(host, port):
                    _given.add(port)
                    return port
        # no room below the ephemeral range (or all tries taken): let the kernel choose
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port


def address_in_use(log_text: str) -> bool:
    """Whether a server's log (or error) says its port was taken."""
    low = log_text.lower()
    return any(m in low for m in _IN_USE)

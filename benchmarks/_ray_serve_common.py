"""What the Ray Serve peers (``_ray_serve_kserve.py``, ``_ray_serve_noop.py``) share: start Ray
and Serve on a free loopback port, run one application, wait until it answers through the
proxy, publish the port in ``--port-file``, then serve until SIGTERM.

Runs in Ray Serve's own environment (``.cache/ray-serve-venv``), imported by the peer scripts
from their own folder (``sys.path[0]`` when a script is run by its path).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only

READY_WITHIN_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_until_term(
    app: Callable[[], Any],
    *,
    name: str,
    route_prefix: str,
    probe: Callable[[str], object],
    port_file: str,
) -> int:
    """Run ``app()`` (a Ray Serve Application) as ``name`` at ``route_prefix``; ready once
    ``probe(base_url)`` returns without an ``OSError``. Returns the exit status: 1 when the
    proxy did not answer within ``READY_WITHIN_S``, 0 after SIGTERM."""
    import ray
    from ray import serve

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    # Ray Serve's own advice for throughput: no per-request access log
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    serve.run(app(), name=name, route_prefix=route_prefix, logging_config=quiet)
    if not _wait_ready(lambda: probe(f"http://127.0.0.1:{port}")):
        print(f"Ray Serve did not answer within {READY_WITHIN_S:.0f} s", file=sys.stderr)
        return 1
    tmp = port_file + ".tmp"  # written whole, then renamed: the reader never sees a part
    Path(tmp).write_text(str(port))
    os.replace(tmp, port_file)
    _wait_for_sigterm()
    serve.shutdown()
    ray.shutdown()
    return 0


def _wait_ready(probe: Callable[[], object]) -> bool:
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        try:
            probe()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def _wait_for_sigterm() -> None:
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(0.2)

"""The peer for ``benchmarks/frontend.py --peer ray-serve``: Ray Serve's HTTP proxy in front of a
no-op deployment, serving the same route and body as inferline's door
(``POST /apps/noop/predict`` with ``{"input": [...]}``, answered ``{"output": [...]}``).

Runs under Ray Serve's own environment (``.cache/ray-serve-venv``, made by ``make``; Ray Serve
is a peer, not a dependency). Ray binds to 127.0.0.1 only (BACKENDS.md). Writes the HTTP port
to ``--port-file`` once the application answers, then serves until SIGTERM.

    .cache/ray-serve-venv/bin/python benchmarks/_ray_serve_noop.py --port-file F [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_app(batch: int):  # returns a Ray Serve Application
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(max_ongoing_requests=1000)
    class Noop:
        """No model work: what is measured is the proxy, the router and the replica hop."""

        if batch > 1:

            @serve.batch(max_batch_size=batch, batch_wait_timeout_s=0.0)
            async def run(self, xs: list) -> list:
                return xs

        else:

            async def run(self, x: object) -> object:
                return x

        async def __call__(self, request: Request) -> dict:
            body = await request.json()
            return {"output": await self.run(body["input"])}

    return Noop.bind()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--batch", type=int, default=32, help="@serve.batch size (1: no batching)")
    args = ap.parse_args()
    import ray
    from ray import serve

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    # Ray Serve's own advice for throughput: no per-request access log
    quiet = {"enable_access_log": False, "log_level": "WARNING"}
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    serve.run(
        build_app(args.batch), name="noop", route_prefix="/apps/noop/predict", logging_config=quiet
    )
    deadline = time.monotonic() + 60
    while True:  # ready when the route answers through the proxy
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/apps/noop/predict",
                data=b'{"input":[0.0]}',
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                print("Ray Serve did not answer within 60 s", file=sys.stderr)
                return 1
            time.sleep(0.2)
    tmp = args.port_file + ".tmp"
    Path(tmp).write_text(str(port))
    os.replace(tmp, args.port_file)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(0.2)
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

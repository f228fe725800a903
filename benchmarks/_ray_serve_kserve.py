"""The Ray Serve column of ``benchmarks/triton_overhead.py``: what a user would build with Ray
Serve in front of Triton, a FastAPI ingress deployment that forwards each KServe v2 request
(infer, metadata, config, statistics) to the same Triton model over HTTP and returns
Triton's answer, so perf_analyzer runs against it unchanged.

Runs in Ray Serve's own environment (``.cache/ray-serve-venv``, made by ``make``; a peer, not
a dependency); Ray binds to 127.0.0.1 only (BACKENDS.md). Writes the HTTP port to
``--port-file`` once a metadata request answers through it, then serves until SIGTERM.

    .cache/ray-serve-venv/bin/python benchmarks/_ray_serve_kserve.py \
        --triton http://127.0.0.1:8000 --model M --port-file F
"""

# no ``from __future__ import annotations``: FastAPI reads the handler's annotations at
# definition time, and ``Request`` is imported inside ``build_app``
import argparse
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only

# request and answer headers that belong to one hop, not to the forwarded message
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_app(triton: str):  # returns a Ray Serve Application
    import aiohttp
    from fastapi import FastAPI, Request, Response
    from ray import serve

    api = FastAPI()

    @serve.deployment(max_ongoing_requests=1000)
    @serve.ingress(api)
    class KServeForward:
        def __init__(self) -> None:
            self.session: aiohttp.ClientSession | None = None

        @api.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(self, path: str, request: Request) -> Response:
            if self.session is None:  # made on the replica's own event loop
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
                )
            headers = {k: v for k, v in request.headers.items() if k not in HOP_HEADERS}
            async with self.session.request(
                request.method, f"{triton}/{path}", data=await request.body(), headers=headers
            ) as r:
                body = await r.read()
                out = {k: v for k, v in r.headers.items() if k.lower() not in HOP_HEADERS}
                return Response(body, status_code=r.status, headers=out)

    return KServeForward.bind()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--triton", required=True, help="Triton's HTTP base URL")
    ap.add_argument("--model", required=True, help="a model to check readiness with")
    ap.add_argument("--port-file", required=True)
    args = ap.parse_args()
    import ray
    from ray import serve

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    quiet = {"enable_access_log": False, "log_level": "WARNING"}  # Ray Serve's throughput advice
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    serve.run(
        build_app(args.triton.rstrip("/")), name="kserve", route_prefix="/", logging_config=quiet
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{args.model}", timeout=5)
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

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
import urllib.request

from _ray_serve_common import serve_until_term

# request and answer headers that belong to one hop, not to the forwarded message
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


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
    triton = args.triton.rstrip("/")
    return serve_until_term(
        lambda: build_app(triton),
        name="kserve",
        route_prefix="/",
        probe=lambda base: urllib.request.urlopen(f"{base}/v2/models/{args.model}", timeout=5),
        port_file=args.port_file,
    )


if __name__ == "__main__":
    raise SystemExit(main())

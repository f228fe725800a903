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
import urllib.request

from _ray_serve_common import serve_until_term


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
    return serve_until_term(
        lambda: build_app(args.batch),
        name="noop",
        route_prefix="/apps/noop/predict",
        probe=_probe,  # ready when the route answers through the proxy
        port_file=args.port_file,
    )


def _probe(base: str) -> None:
    req = urllib.request.Request(
        f"{base}/apps/noop/predict",
        data=b'{"input":[0.0]}',
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=5).read()


if __name__ == "__main__":
    raise SystemExit(main())

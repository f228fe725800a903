"""``inferline drain`` / ``inferline undrain``: take one server of a fleet out of service for an
upgrade, and put it back.

``inferline drain triton+grpc://10.0.0.7:8001 --server http://127.0.0.1:8080`` asks the running
inferline server (``POST /admin/drain``) to send no new batches to that member of its fleet
backend; batches in flight there finish. It waits up to ``--wait-s`` for the last one and
exits 0 when the server is empty (safe to stop), 1 when batches were still in flight at the
end of the wait. ``inferline undrain URL --server ...`` (``POST /admin/undrain``) sends it
batches again. The bearer token is ``--token`` or ``$INFERLINE_TOKEN``, as for ``detach``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from inferline.core import BackendError

__all__ = ["register"]


def _post(
    server: str, route: str, body: dict[str, Any], token: str | None, timeout_s: float
) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = server.rstrip("/") + route
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise BackendError(server, f"no inferline server answered ({type(e).__name__})") from None
    try:
        out = r.json()
    except ValueError:
        out = {"detail": r.text[:200]}
    if r.status_code != 200:
        detail = out.get("detail") or out.get("error") or out if isinstance(out, dict) else out
        raise BackendError(server, f"{route} refused ({r.status_code}): {detail}")
    return out


def _token(args: argparse.Namespace) -> str | None:
    from inferline.cli._server_args import TOKEN_ENV

    return args.token or os.environ.get(TOKEN_ENV) or None


def _drain(args: argparse.Namespace) -> int:
    body = {"server": args.url, "wait_s": args.wait_s}
    out = _post(args.server, "/admin/drain", body, _token(args), args.wait_s + 30.0)
    if out.get("empty"):
        print(f"inferline: {args.url} is drained (nothing in flight): {json.dumps(out)}")
        return 0
    print(
        f"inferline: {args.url} is draining, still busy after {args.wait_s:g} s: {json.dumps(out)}"
    )
    return 1


def _undrain(args: argparse.Namespace) -> int:
    out = _post(args.server, "/admin/undrain", {"server": args.url}, _token(args), 30.0)
    print(f"inferline: {args.url} takes batches again: {json.dumps(out)}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url", metavar="SERVER_URL", help="the fleet member, as listed in the deployment's backend"
    )
    p.add_argument(
        "--server", required=True, help="the running inferline server, e.g. http://127.0.0.1:8080"
    )
    p.add_argument(
        "--token",
        default=None,
        help="bearer token of the inferline server (default $INFERLINE_TOKEN)",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser(
        "drain",
        help="stop sending batches to one server of a fleet (for an upgrade)",
        description=__doc__,
    )
    _common(d)
    d.add_argument(
        "--wait-s",
        type=float,
        default=30.0,
        help="how long to wait for the batches in flight there, seconds (0: do not wait)",
    )
    d.set_defaults(func=_drain)
    u = sub.add_parser(
        "undrain", help="send batches to a drained server of a fleet again", description=__doc__
    )
    _common(u)
    u.set_defaults(func=_undrain)

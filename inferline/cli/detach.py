"""``inferline detach``: put back the operator's settings that ``inferline attach`` changed.

``inferline detach --server http://127.0.0.1:8080`` asks the running attach server to restore
the backend's instance counts and batching settings (and unload the models it loaded) and to
stop (``POST /admin/detach``). ``inferline detach triton://host:8000 --snapshot PATH`` restores
them from the snapshot file attach wrote when it started, for when the attach process is gone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from typing import Any

from inferline.core import BackendError, ValidationError, load_json

__all__ = ["register"]

# a snapshot's "kind" -> the adapter package with its restore_snapshot(url, snapshot)
_RESTORERS = {
    "triton": "inferline.adapters.triton",
    "tfserving": "inferline.adapters.tfserving",
}


def _token(args: argparse.Namespace) -> str | None:
    from inferline.cli.attach import TOKEN_ENV

    return args.token or os.environ.get(TOKEN_ENV) or None


def _ask_server(server: str, token: str | None, timeout_s: float) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = server.rstrip("/") + "/admin/detach"
    try:
        r = httpx.post(url, json={}, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise BackendError(
            server,
            f"no attach server answered ({type(e).__name__}); if the attach process is gone, "
            "run `inferline detach BACKEND_URL --snapshot PATH`",
        ) from None
    try:
        body = r.json()
    except ValueError:
        body = {"detail": r.text[:200]}
    if r.status_code != 200:
        if r.status_code == 404:
            detail = "not an attach server that can restore its backend (no /admin/detach)"
        else:
            detail = str(body.get("detail") or body.get("error") or body)
        raise BackendError(server, f"detach refused ({r.status_code}): {detail}")
    return dict(body)


def _restore_one(
    url: str, snapshot: Any, where: str, token: str | None, timeout_s: float
) -> dict[str, Any]:
    kind = snapshot.get("kind") if isinstance(snapshot, dict) else None
    if kind not in _RESTORERS:
        raise ValidationError(f"{where}: kind", f"one of {sorted(_RESTORERS)}", kind)
    scheme = url.split("://", 1)[0].lower()
    if not scheme.startswith(str(kind)):
        raise ValidationError("url", f"a {kind}:// URL (the snapshot is of {kind})", url)
    restore = importlib.import_module(_RESTORERS[str(kind)]).restore_snapshot
    from inferline.server import run_loop

    done = run_loop(restore(url, snapshot, token=token, timeout_s=timeout_s))
    return {"backend": url, "restored": done}


def _restore_from(url: str, path: str, token: str | None, timeout_s: float) -> dict[str, Any]:
    snapshot = load_json(path)
    if not (isinstance(snapshot, dict) and snapshot.get("kind") == "fleet"):
        return _restore_one(url, snapshot, path, token, timeout_s)
    # a fleet's snapshot holds one per server, each with the URL attach reached it at: the
    # URL given must be one of them (a check that the right file is at hand), and every
    # member is restored, so one command puts the whole fleet back
    members = snapshot.get("members")
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise ValidationError(f"{path}: members", "a list of server snapshots", members)
    urls = [str(m.get("url", "")) for m in members]
    if url not in urls:
        raise ValidationError("url", f"one of the fleet's servers {urls}", url)
    return {
        "backend": url,
        "members": [
            _restore_one(u, m, f"{path}: members[{i}]", token, timeout_s)
            for i, (u, m) in enumerate(zip(urls, members, strict=True))
        ],
    }


def _detach(args: argparse.Namespace) -> int:
    token = _token(args)
    if args.server:
        if args.url or args.snapshot:
            raise ValidationError("--server", "no BACKEND_URL or --snapshot with it", args.url)
        out = _ask_server(args.server, token, args.timeout_s)
    else:
        if not args.url or not args.snapshot:
            raise ValidationError(
                "detach", "--server URL, or BACKEND_URL with --snapshot PATH", args.url
            )
        out = _restore_from(args.url, args.snapshot, token, args.timeout_s)
        os.replace(args.snapshot, args.snapshot + ".restored")  # spent: not restored twice
    print(f"inferline: detached; the operator's settings are back: {json.dumps(out)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser(
        "detach",
        help="put back the backend settings `inferline attach` changed, and stop it",
        description=__doc__,
    )
    d.add_argument(
        "url",
        nargs="?",
        default=None,
        metavar="BACKEND_URL",
        help="the backend attach was attached to (with --snapshot), e.g. triton://host:8000",
    )
    d.add_argument(
        "--server", default=None, help="a running attach server, e.g. http://127.0.0.1:8080"
    )
    d.add_argument(
        "--snapshot",
        default=None,
        metavar="PATH",
        help="the snapshot `inferline attach` wrote (--snapshot; default "
        "inferline-attach-snapshot.json): restore from it when attach is gone",
    )
    d.add_argument(
        "--token",
        default=None,
        help="bearer token of the attach server (--server) or of the backend (default "
        "$INFERLINE_TOKEN)",
    )
    d.add_argument(
        "--timeout-s", type=float, default=120.0, help="how long restoring may take, seconds"
    )
    d.set_defaults(func=_detach)

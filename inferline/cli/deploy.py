"""``inferline deploy PLAN``: apply a plan to a running server (``--url``, ``PUT /admin/plan``), or serve the deployment with it."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from inferline.cli._args import (
    http_url,
)
from inferline.cli._server_args import add_server_args, token_of
from inferline.cli.serve import serve_with
from inferline.core import (
    ValidationError,
    load_plan,
)

__all__ = ["register"]

log = logging.getLogger(__name__)


def _deploy(args: argparse.Namespace) -> int:
    from inferline.deploy import load_deployment, planned_models

    dep = load_deployment(args.deployment)
    plan = load_plan(args.plan)
    names = {m.name for m in dep.models}
    planned = planned_models(plan)
    unknown = sorted(set(planned) - names)
    if unknown:
        where = "variants" if plan.variants is not None else "models"
        raise ValidationError(
            f"{args.plan}: {where}", f"models of deployment {dep.name!r}", unknown
        )
    for m in sorted(names - set(planned)):
        log.warning(
            "plan %s has no configuration for %r: it gets 1 cpu replica, batch 1", args.plan, m
        )
    if args.url:
        import httpx

        headers = {"Authorization": f"Bearer {token_of(args)}"} if token_of(args) else {}
        try:
            r = httpx.put(
                args.url.rstrip("/") + "/admin/plan",
                json=plan.to_dict(),
                headers=headers,
                timeout=600,
            )
        except httpx.TransportError as e:  # refused, unknown host, timed out: a traceback before
            raise ValidationError("--url", "a reachable inferline server", str(e)) from None
        body = _json_or_none(r)
        applied = body.get("applied") if isinstance(body, dict) else None
        if isinstance(applied, dict):  # also on a 502: which models moved and which did not
            for model, what in applied.items():
                print(f"{model}: {what}")
        if r.status_code != 200:
            raise ValidationError(
                "server", "a 200 answer to PUT /admin/plan", f"{r.status_code} {r.text}"
            )
        return 0
    for model, cfg in planned.items():
        print(f"{model}: {cfg.replicas} x {cfg.hardware}, max batch {cfg.max_batch_size}")
    if args.dry_run:
        return 0
    return serve_with(args, dep, plan)


def _json_or_none(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("deploy", help="apply a plan: to a running server (--url), or serve it")
    d.add_argument("plan", help="plan JSON (inferline.plan/1)")
    d.add_argument(
        "--deployment", required=True, help="deployment JSON (inferline.deployment/1) of the plan"
    )
    d.add_argument(
        "--url",
        type=http_url(("http", "https")),
        default=None,
        help="running server to reconfigure",
    )
    d.add_argument("--dry-run", action="store_true", help="check and print, do not deploy")
    add_server_args(d)
    d.set_defaults(func=_deploy)

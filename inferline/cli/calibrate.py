"""``inferline calibrate``: profiles scaled to a running server's live service times."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from inferline.cli._args import count, http_url, output_path
from inferline.core import ValidationError, load_plan, load_profiles, save
from inferline.measure import (
    MIN_BATCHES,
    CalibrationRow,
    calibrate_profiles,
    live_service_from_admin,
)

__all__: list[str] = []

TOKEN_ENV = "INFERLINE_TOKEN"


def _fetch_models(url: str, token: str | None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(url.rstrip("/") + "/admin/models", headers=headers, timeout=30)
    except httpx.TransportError as e:
        raise ValidationError("--url", "a reachable inferline server", str(e)) from None
    if r.status_code != 200:
        raise ValidationError(
            "server", "a 200 answer to GET /admin/models", f"{r.status_code} {r.text[:200]}"
        )
    try:
        return r.json()
    except ValueError:
        raise ValidationError("server", "JSON from GET /admin/models", r.text[:200]) from None


def _print(rows: list[CalibrationRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="live service time / profile (median, P99)")
    for c in ("model", "hw", "batches", "sizes", "x p50", "x p99", "note"):
        t.add_column(c, justify="right" if c in ("batches", "x p50", "x p99") else "left")
    for r in rows:
        t.add_row(
            r.model,
            r.hardware,
            str(r.batches),
            ",".join(map(str, r.sizes)),
            f"{r.p50_factor:.2f}" if r.calibrated else "-",
            f"{r.p99_factor:.2f}" if r.calibrated else "-",
            r.note or "calibrated; wake-up extras dropped",
        )
    Console(stderr=True).print(t)


def _calibrate(args: argparse.Namespace) -> int:
    profiles = load_profiles(args.profiles)
    plan = load_plan(args.plan)
    hardware = {m: cfg.hardware for m, cfg in plan.models.items()}
    token = args.token or os.environ.get(TOKEN_ENV) or None
    live = live_service_from_admin(_fetch_models(args.url, token))
    new, rows = calibrate_profiles(profiles, hardware, live, args.min_batches)
    _print(rows)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    if not any(r.calibrated for r in rows):
        raise ValidationError(
            "--url",
            f"live batches of the plan's models ({args.min_batches}+ of one size; serve traffic "
            "first, or lower --min-batches)",
            "none",
        )
    save(new, args.output)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "calibrate",
        help="scale profiles to a running server's live service times",
        description="Read the service-time quantiles per batch size of the last 1024 batches "
        "of each model from a running server (GET /admin/models), scale each model's profile "
        "on its planned hardware by the live/profiled ratios of the median and the P99, and "
        "write the result. Plan or simulate it with --service-spread. The wake-up extras of a "
        "calibrated model are dropped: its live times already contain them.",
    )
    p.add_argument("--profiles", required=True, help="profiles JSON (inferline.profiles/1)")
    p.add_argument("--plan", required=True, help="the plan the server runs (its hardware)")
    p.add_argument(
        "--url", type=http_url(("http", "https")), required=True, help="running inferline server"
    )
    p.add_argument("--token", default=None, help=f"bearer token (or ${TOKEN_ENV})")
    p.add_argument(
        "--min-batches",
        type=count,
        default=MIN_BATCHES,
        help="live batches a batch size needs to count (default %(default)s)",
    )
    p.add_argument(
        "-o", "--output", type=output_path(), required=True, help="calibrated profiles JSON"
    )
    p.add_argument("--json", action="store_true", help="also print the factors as JSON")
    p.set_defaults(func=_calibrate)

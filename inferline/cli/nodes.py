"""``inferline nodes URL [URL ...]``: a backend's machines, one inventory per node (``ray://``)
or per server (a fleet's members: Triton, TF Serving, ``local://``; each member's own
inventory, where it came from, the instances its server runs, and the hop to it: median and
P99 round trip of its readiness call over ``--tries`` calls), printed as a table (or
``--json``) and written as the ``inferline.nodes/1`` file ``inferline plan --inventory-nodes``
reads. See docs/fleets.md, "Inventories"."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from inferline.cli._args import output_path
from inferline.core import ValidationError, dump_json
from inferline.core.planning import nodes_document, nodes_from_dicts

__all__ = ["register"]


async def _read_nodes(urls: list[str], tries: int) -> tuple[list[dict[str, Any]], bool]:
    """Each node's row, and whether the backend is a fleet (rows with the hop and more).
    One URL that is not a per-node backend (``triton+grpc://...``) is a one-member fleet."""
    from inferline.deploy import open_backend, plugin_host

    host = plugin_host()
    backend = open_backend(host, urls[0] if len(urls) == 1 else urls)
    if len(urls) == 1 and not callable(getattr(backend, "nodes", None)):
        await backend.close()
        backend = open_backend(host, urls)
    try:
        report = getattr(backend, "inventory_report", None)
        if callable(report):  # a fleet: the hop to each server is part of its service time
            return await report(tries), True
        nodes = getattr(backend, "nodes", None)
        if not callable(nodes):
            raise ValidationError(
                "URL", "a backend with a per-node view (nodes(): ray://, or a fleet)", urls
            )
        return [n.to_dict() for n in nodes()], False
    finally:
        await backend.close()


def _units(units: Any) -> str:
    if units is None:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in sorted(units.items())) or "nothing"


def _hop(row: dict[str, Any], key: str) -> str:
    hop = row.get("hop")
    if hop is not None:
        return f"{hop[key]:.2f}"
    return "in-process" if row.get("hop_kind") == "none" else "no answer"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """The fleet's members as aligned columns, one line each after a header."""
    head = ["server", "state", "hardware", "free", "inventory", "served instances"]
    head += ["hop p50 ms", "hop p99 ms", "tries"]
    body = [
        [
            r["node_id"],
            "alive" if r.get("alive", True) else "dead (left out)",
            _units(r.get("hardware")),
            _units(r.get("free")),
            str(r.get("inventory_from", "-")),
            _units(r.get("served_instances")),
            _hop(r, "median_ms"),
            _hop(r, "p99_ms"),
            str(r["hop"]["tries"]) if r.get("hop") else "-",
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [head, *body]
    ]


def _line(d: dict[str, Any]) -> str:
    units = _units(d.get("hardware"))
    state = "alive" if d.get("alive", True) else "dead (left out)"
    return f"node {d['node_id']} {d.get('address', '')}: {units} [{state}]"


def _planner_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as ``nodes_from_dicts`` reads them (a node's own keys only)."""
    keep = ("node_id", "address", "alive", "hardware", "free")
    return [{k: r[k] for k in keep if k in r} for r in rows]


def _nodes(args: argparse.Namespace) -> int:
    rows, fleet = asyncio.run(_read_nodes(list(args.url), args.tries))
    alive = nodes_from_dicts(_planner_view(rows) if fleet else rows)
    if args.json:
        print(json.dumps({"nodes": rows}, indent=2, sort_keys=True))
    else:
        for line in _table(rows) if fleet else [_line(d) for d in rows]:
            print(line)
    if args.output:
        Path(args.output).write_text(dump_json(nodes_document(alive)))
        if not args.json:  # --json keeps stdout one JSON document
            print(f"wrote {len(alive)} node inventories to {args.output}")
    return 0


def _tries(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--tries: expected an int >= 1, got {text!r}")
    return n


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "nodes",
        help="a backend's machines (ray://) or a fleet's servers: one inventory per node "
        "(and the hop to each server), for plan --inventory-nodes",
        description="Print each node of a backend with a per-node view (ray://HOST:PORT), or "
        "each server of a fleet (one or more Triton / TF Serving / local:// URLs: its own "
        "inventory, e.g. Triton's ?cpu_cores= and ?gpus=, where that came from, the instances "
        "its server runs, and the hop to it: median and P99 round trip of its readiness call "
        "over --tries calls), and write them as the inferline.nodes/1 file that "
        "`inferline plan --inventory-nodes` reads (alive nodes, their capacity by "
        "hardware-catalog name).",
    )
    p.add_argument(
        "url",
        nargs="+",
        help="backend URL, e.g. ray://10.0.0.5:6379 or ray://auto; or a fleet's servers",
    )
    p.add_argument(
        "-o", "--output", type=output_path(), default=None, help="where to write the nodes JSON"
    )
    p.add_argument(
        "--tries", type=_tries, default=15, help="timed readiness calls per server (default 15)"
    )
    p.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    p.set_defaults(func=_nodes)

"""``inferline nodes URL``: a backend's machines, one inventory per node (``ray://``), printed
and written as the ``inferline.nodes/1`` file ``inferline plan --inventory-nodes`` reads."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from inferline.cli._args import output_path
from inferline.core import ValidationError, dump_json
from inferline.core.planning import nodes_document, nodes_from_dicts

__all__ = ["register"]


async def _read_nodes(url: str) -> list[dict[str, Any]]:
    from inferline.deploy import open_backend, plugin_host

    backend = open_backend(plugin_host(), url)
    try:
        nodes = getattr(backend, "nodes", None)
        if not callable(nodes):
            raise ValidationError("URL", "a backend with a per-node view (nodes(), ray://)", url)
        return [n.to_dict() for n in nodes()]
    finally:
        await backend.close()


def _nodes(args: argparse.Namespace) -> int:
    raw = asyncio.run(_read_nodes(args.url))
    for d in raw:
        units = ", ".join(f"{k}={v}" for k, v in sorted(d.get("hardware", {}).items()))
        state = "alive" if d.get("alive", True) else "dead (left out)"
        print(f"node {d['node_id']} {d.get('address', '')}: {units or 'nothing'} [{state}]")
    alive = nodes_from_dicts(raw)
    if args.output:
        Path(args.output).write_text(dump_json(nodes_document(alive)))
        print(f"wrote {len(alive)} node inventories to {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "nodes",
        help="a backend's machines (ray://): one inventory per node, for plan --inventory-nodes",
        description="Print each node of a backend with a per-node view (ray://HOST:PORT) and "
        "write them as the inferline.nodes/1 file that `inferline plan --inventory-nodes` "
        "reads (alive nodes, their capacity by hardware-catalog name).",
    )
    p.add_argument("url", help="backend URL, e.g. ray://10.0.0.5:6379 or ray://auto")
    p.add_argument(
        "-o", "--output", type=output_path(), default=None, help="where to write the nodes JSON"
    )
    p.set_defaults(func=_nodes)

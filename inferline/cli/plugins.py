"""``inferline plugins``: the registered plugins, backend schemes and observers."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _plugins(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from inferline.deploy import plugin_host

    host = plugin_host()
    t = Table(title="inferline plugins (entry-point group 'inferline')")
    for col in ("plugin", "from", "hooks"):
        t.add_column(col)
    for name, d in sorted(host.describe().items()):
        hooks = ", ".join(h.removeprefix("inferline_") for h in d["hooks"])
        t.add_row(
            name,
            d.get("origin", ""),
            hooks if "error" not in d else f"[red]failed: {d['error']}[/]",
        )
    Console(width=max(100, Console().width)).print(t)
    print("backend schemes:", ", ".join(host.schemes()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("plugins", help="list the registered plugins and backend schemes")
    p.set_defaults(func=_plugins)

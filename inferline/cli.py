"""The ``inferline`` command. Each subcommand lives in a small ``_cli_*`` module that registers
its parser; errors print as one line with a non-zero exit (tracebacks only with ``--debug``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from inferline.core.errors import InferlineError

__all__ = ["main", "register"]

Registrar = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]
_REGISTRARS: list[Registrar] = []


def register(fn: Registrar) -> Registrar:
    _REGISTRARS.append(fn)
    return fn


class _CommandParser(argparse.ArgumentParser):
    """A command's parser. Rules over several options, which no ``type=`` sees (``--x needs
    --y``), go in the command's ``check_args`` default: a function of the parsed options that
    returns what is wrong, or None. It runs here, so those too are refused at parse time with the
    command's usage and exit status 2 (a nested command's parent runs it again: it is cheap)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        check = getattr(ns, "check_args", None)
        problem = check(ns) if check is not None else None
        if problem:
            self.error(problem)
        return ns, rest


def build_parser() -> argparse.ArgumentParser:
    # Importing the command modules registers their subparsers.
    from inferline import _cli_trace  # noqa: F401

    for mod in ("_cli_plan", "_cli_serve", "_cli_calibrate", "_cli_tools", "_cli_attach"):
        try:
            __import__(f"inferline.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"inferline.{mod}":
                raise
    p = argparse.ArgumentParser(
        prog="inferline",
        description="Plan, simulate, serve and tune ML prediction pipelines under latency SLOs.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    sub.required = True
    seen: set[int] = set()
    for fn in _REGISTRARS:
        if id(fn) not in seen:
            seen.add(id(fn))
            fn(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.debug:  # a line per HTTP request from the client library is noise in a CLI
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        rc = args.func(args)
    except InferlineError as e:
        if args.debug:
            raise
        print(f"inferline: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferline: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``inferline`` command: one module per verb, listed in ``VERBS``.

Each verb module has ``register(sub)``, which adds its subparser. The list is explicit and an
import error in a verb module fails the command loudly (before, a verb whose module did not
import vanished from ``inferline --help`` without a word). Errors print as one line with a
non-zero exit (tracebacks only with ``--debug``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from inferline.core.errors import InferlineError

__all__ = ["VERBS", "build_parser", "main"]

# The verbs in the order ``inferline --help`` lists them: ``inferline.cli.<name>``.
VERBS = (
    "trace",
    "plan",
    "nodes",
    "simulate",
    "profile",
    "serve",
    "deploy",
    "export",
    "replay",
    "attach",
    "detach",
    "drain",
    "calibrate",
    "plugins",
    "demo",
)


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
    p = argparse.ArgumentParser(
        prog="inferline",
        description="Plan, simulate, serve and tune ML prediction pipelines under latency SLOs.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    sub.required = True
    for verb in VERBS:
        importlib.import_module(f"inferline.cli.{verb}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # Replicas are started with fork + exec while the server's gRPC channels are busy; gRPC's
    # fork handlers then crashed about half the replicas started under load (SIGSEGV before
    # the exec, integration/test_drift_live.py). Nothing of ours uses gRPC in a forked child
    # without exec, so the handlers are not needed. Read once, when grpc is first imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
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

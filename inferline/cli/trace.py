"""``inferline trace ...``: generate, convert and describe arrival traces."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from inferline.cli._args import number_in, output_path, positive, seed, too_many_arrivals
from inferline.core import (
    gamma_trace,
    load_csv_trace,
    load_trace,
    max_arrivals_in_window,
    mean_rate,
    rescale_to_rate,
    save_trace,
    varying_trace,
)

__all__ = ["register"]


def _gamma(args: argparse.Namespace) -> int:
    trace = gamma_trace(args.rate, args.cv, args.duration_s, np.random.default_rng(args.seed))
    save_trace(trace, args.output)
    print(f"wrote {trace.size} arrivals to {args.output}")
    return 0


def _varying(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    trace = varying_trace(args.segment, rng, transition_s=args.transition_s)
    save_trace(trace, args.output)
    print(f"wrote {trace.size} arrivals to {args.output}")
    return 0


def _from_csv(args: argparse.Namespace) -> int:
    trace = load_csv_trace(args.csv, column=args.column)
    if args.rate is not None:
        trace = rescale_to_rate(trace, args.rate)
    save_trace(trace, args.output)
    print(f"wrote {trace.size} arrivals ({mean_rate(trace):.3f} q/s) to {args.output}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)
    gaps = np.diff(trace)
    out = {
        "arrivals": int(trace.size),
        "span_s": float(trace[-1] - trace[0]),
        "mean_rate_qps": mean_rate(trace),
        "cv": float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else 0.0,
        "peak_rate_qps": {
            str(w): max_arrivals_in_window(trace, w) / w for w in (0.1, 1.0, 10.0, 60.0)
        },
    }
    print(json.dumps(out, indent=2))
    return 0


_rate = positive("queries/s")
_seconds = positive("seconds")
# Outside this the gamma draws break down: a CV near 0 overflows the shape 1/CV^2 (a
# ZeroDivisionError), one of 1e5 draws gaps that never move time on (the generator hung).
_cv = number_in(1e-3, 100, "a coefficient of variation")
_SEGMENT = "RATE,CV,DURATION_S"


def _segment(text: str) -> tuple[float, float, float]:
    """A ``--segment``: a rate and a length > 0 (a zero or NaN length crashed the generator)
    and a CV as ``--cv`` takes."""
    try:
        r, c, d = text.split(",")  # ValueError: not three parts
        return _rate(r), _cv(c), _seconds(d)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"expected {_SEGMENT}: a rate and a length > 0, a CV in [0.001, 100], got {text!r}"
        ) from None


def _check_gamma(args: argparse.Namespace) -> str | None:
    return too_many_arrivals(args.rate * args.duration_s, "--rate/--duration-s")


def _check_varying(args: argparse.Namespace) -> str | None:
    # a transition moves between neighbouring rates, so the segments' own sizes bound it
    return too_many_arrivals(sum(r * d for r, _, d in args.segment), "--segment")


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        type=output_path(),
        required=True,
        help="where to write the trace (one arrival time in seconds per line)",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("trace", help="generate or convert arrival traces")
    ts = p.add_subparsers(dest="trace_command", metavar="KIND")
    ts.required = True

    g = ts.add_parser("gamma", help="gamma-process arrivals with a given rate and CV")
    g.add_argument("--rate", type=_rate, required=True, help="mean arrival rate, queries/s")
    g.add_argument(
        "--cv", type=_cv, default=1.0, help="coefficient of variation, 0.001 to 100 (default 1)"
    )
    g.add_argument("--duration-s", type=_seconds, required=True, help="trace length, seconds")
    g.add_argument("--seed", type=seed, default=0, help="random seed (default %(default)s)")
    _add_output(g)
    g.set_defaults(func=_gamma, check_args=_check_gamma)

    v = ts.add_parser("varying", help="move between (rate, CV) segments over a transition time")
    v.add_argument(
        "--segment",
        type=_segment,
        action="append",
        required=True,
        metavar=_SEGMENT,
        help="a segment: rate in queries/s, CV and length in seconds (repeatable, in order)",
    )
    v.add_argument(
        "--transition-s",
        type=number_in(0, math.inf, "seconds"),  # a negative or NaN one was taken as 0
        default=0.0,
        help="seconds at the start of each next segment over which rate and CV change "
        "linearly from the previous one (default 0: an abrupt change)",
    )
    v.add_argument("--seed", type=seed, default=0, help="random seed (default %(default)s)")
    _add_output(v)
    v.set_defaults(func=_varying, check_args=_check_varying)

    c = ts.add_parser("from-csv", help="arrival times from a CSV timestamp column")
    c.add_argument("csv")
    c.add_argument(
        "--column",
        default="TIMESTAMP",
        help="column of timestamps, seconds or ISO datetimes (default %(default)s)",
    )
    c.add_argument("--rate", type=_rate, default=None, help="rescale to this mean rate")
    _add_output(c)
    c.set_defaults(func=_from_csv)

    d = ts.add_parser("describe", help="print rate, CV and peak rates of a trace")
    d.add_argument("trace")
    d.set_defaults(func=_describe)

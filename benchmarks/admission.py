"""Admission by predicted completion vs today's expiry under overload (issue 45).

One model, the bundled runtime's ``sleep`` example (10 ms per batch plus 1 ms per item), one
replica, batches up to 8 (capacity 8 / 18 ms = 444 q/s), a 100 ms SLO. Poisson arrivals at
1x, 2x, 3x and 5x that capacity, each for ``--seconds`` (30 by default). The server runs
as ``inferline serve`` runs it, in this process (the HTTP app on uvicorn and uvloop,
``gc.freeze()`` once warm; the replica is its own process, reached over gRPC); the load
client is a process of its own (``_admission_client.py``) sending ``POST /apps/app/predict``
over real sockets and handing its results back as JSON (``_admission_server.py``). Rows:

- ``admission``: ``"queue": {"admission": "predicted", "expire_grace_ms": 5}`` (refused at
  once when predicted late; dropped from the queue as soon as it is doomed, or when a batch
  cut finds it late; answered DeadlineExceeded, counted in ``expired``, when its batch still
  runs 5 ms past its deadline: ``--grace-ms``),
- ``expiry``: today's ``"expire_late": true`` with the default 50 ms grace,
- ``admission+prio`` at 3x: 10% of the queries at priority 1.

Columns: offered rate; goodput (predictions answered within the SLO by the client's clock,
per second) and its share of the goodput measured at 1x with admission; answers later than
deadline + 5 ms by the client's clock (from each query's scheduled arrival) and by the
server's (``srv late``: from the request reaching the HTTP app to its response starting);
refusals at arrival (429 ``predicted_late``) and dispatch drops (429 ``dropped_late``) with
their P99 time to answer; expired (504); the P99 of predictions; the priority class's on-time
share; how late the client sent (P99 / max) and how late the server's loop woke for a 5 ms
timer (P99 / max); the longest full garbage collection in the server; ``q late``: queries
whose queue delay plus batch run ended past deadline + 5 ms (the dispatcher's BatchEvents)
and ``overran``: those whose batch ran past admission's predicted completion; the server's
and the client's CPU as a share of one core.

Targets (issue 45): goodput at 2x-5x at least 95% of the 1x capacity; no answer later than
deadline + 5 ms with admission; refusals within 2 ms of arrival at P99; the priority class's
on-time share at 3x at least 99%. "Refusals" reads as the refusals admission makes at
arrival (``refused``); a query admitted and later dropped by Clockwork's dispatch rule when a
batch is cut (``dropped``, 429 too) waited in the queue first and is shown apart, with its own
P99 time to answer.

``triton REJECT`` rows (unless ``--no-triton``; off with ``--smoke`` unless ``--triton``):
the same model in real Triton with ``default_queue_policy`` REJECT at the SLO
(``_admission_triton.py``); its refusals are Triton's timeouts.

Run: ``.venv/bin/python benchmarks/admission.py [--smoke] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from _admission_inproc import inproc_drive
from _admission_server import Row, http_drive, run_rows

from inferline.core import ModelConfig, Plan
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment
from inferline.server import run_loop

SLO_S = 0.100
CAPACITY_QPS = 8 / 0.018
LATE_SLACK_S = 0.005
PLAN = Plan("sleep", SLO_S, {"m": ModelConfig("cpu", 8, 1)})


CLIENT_NOTES = {
    "http": "client in its own process over HTTP",
    "inproc": "client in this process through the service's predict (no HTTP door)",
}


def _deployment(mode: str, grace_ms: float) -> Deployment:
    d = sleep_deployment(base_s=0.010, per_item_s=0.001, slo_ms=SLO_S * 1e3, max_queue=100_000)
    if mode.startswith("admission"):
        d["queue"]["admission"] = "predicted"
        # a query whose batch still runs at its deadline + this grace is answered
        # DeadlineExceeded then (counted as expired), not awaited (docs/deadlines.md)
        d["queue"]["expire_grace_ms"] = grace_ms
    else:
        d["queue"]["expire_late"] = True
    return Deployment.from_dict(d)


def _p99_ms(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) * 1e3 if xs else float("nan")


def _ms(x: float) -> float:
    return x * 1e3 if math.isfinite(x) else float("nan")


HEAD = (
    f"{'mode':<15} {'load':>5} {'offered/s':>9} {'goodput/s':>9} {'of 1x':>6} "
    f"{'late>+5ms':>9} {'srv late':>8} {'refused':>8} {'refuse p99 ms':>13} {'dropped':>7} "
    f"{'drop p99 ms':>11} {'expired':>7} {'ok p99 ms':>9} {'hi on-time':>10} "
    f"{'cli lag p99/max ms':>18} {'srv lag p99/max ms':>18} {'gc max ms':>9} "
    f"{'q late':>6} {'overran':>7} {'cpu srv/cli %':>13}"
)


def _line(r: Row, base: float) -> str:
    g = r.goodput_qps(SLO_S)
    hi = f"{r.hi['on_time'] / r.hi['total']:.3f}" if r.hi.get("total") else "-"
    srv = "-" if r.mode.startswith("triton") else str(r.srv_late(SLO_S, LATE_SLACK_S))
    cli = f"{_ms(r.lag_p99_s):.1f}/{_ms(r.lag_max_s):.0f}"
    lag = f"{_ms(r.srv_lag_p99_s):.1f}/{_ms(r.srv_lag_max_s):.0f}"
    s = r.seconds or float("nan")
    cpu = f"{r.srv_cpu_s / s * 100:.0f}/{r.cli_cpu_s / s * 100:.0f}"
    return (
        f"{r.mode:<15} {r.factor:>4g}x {r.offered_qps:>9.0f} {g:>9.0f} {g / base:>6.2f} "
        f"{r.late(SLO_S, LATE_SLACK_S):>9} {srv:>8} {len(r.refused):>8} "
        f"{_p99_ms(r.refused):>13.2f} {len(r.dropped):>7} {_p99_ms(r.dropped):>11.1f} "
        f"{r.expired:>7} {_p99_ms(r.ok):>9.1f} {hi:>10} {cli:>18} {lag:>18} "
        f"{r.gc_max_s * 1e3:>9.1f} {r.q_late:>6} {r.overran:>7} {cpu:>13}"
    )


def _print(rows: list[Row], seconds: float, client_note: str, triton_note: str = "") -> bool:
    base = next(r for r in rows if r.mode == "admission" and r.factor == 1.0).goodput_qps(SLO_S)
    print(
        f"Admission by predicted completion vs expiry: sleep model (10 ms + 1 ms/item), one "
        f"replica, batch 8, SLO {SLO_S * 1e3:.0f} ms, Poisson, {seconds:g} s per rate; "
        + client_note
    )
    print(HEAD)
    for r in rows:
        print(_line(r, base))
    if triton_note:
        print(f"triton REJECT   -     {triton_note}")
    for r in rows:
        if r.hi.get("total"):
            print(f"priority class at {r.factor:g}x ({r.mode}): {r.hi}")
    adm = [r for r in rows if r.mode == "admission" and r.factor >= 2]
    good = all(r.goodput_qps(SLO_S) >= 0.95 * base for r in adm)
    mine = [r for r in rows if r.mode.startswith("admission")]
    no_late = all(r.late(SLO_S, LATE_SLACK_S) == 0 for r in mine)
    no_srv_late = all(r.srv_late(SLO_S, LATE_SLACK_S) == 0 for r in mine)
    fast = all(_p99_ms(r.refused) <= 2.0 for r in adm if r.refused)
    prio = [r for r in rows if r.mode == "admission+prio"]
    hi_ok = all(r.hi.get("total") and r.hi["on_time"] / r.hi["total"] >= 0.99 for r in prio)

    def met(x: bool) -> str:
        return "met" if x else "NOT met"

    print(
        f"targets: goodput at 2x-5x >= 95% of 1x: {met(good)}; no answer later than "
        f"deadline + 5 ms with admission: {met(no_late)} (client clock), {met(no_srv_late)} "
        f"(server clock); refusals at arrival within 2 ms at P99: {met(fast)}; priority "
        f"class on time >= 99% at 3x: {met(hi_ok)}"
    )
    return good and no_late


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="2 s per rate (under a minute)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per rate (30)")
    ap.add_argument(
        "--triton",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the Triton REJECT rows (real Triton, started here); default on, off with --smoke",
    )
    ap.add_argument(
        "--client",
        choices=("http", "inproc"),
        default="http",
        help="http: the client a process of its own over HTTP (the door end to end); inproc: "
        "the load through the service's predict in this process (the queue's policy alone, "
        "no HTTP door; docs/deadlines.md); --smoke runs inproc plus one HTTP row at 1x",
    )
    ap.add_argument(
        "--grace-ms",
        type=float,
        default=LATE_SLACK_S * 1e3,
        help="admission rows: queue.expire_grace_ms, past which a batch still running is "
        "answered DeadlineExceeded, not awaited (5: the late column's slack)",
    )
    args = ap.parse_args(argv)
    seconds = args.seconds or (2.0 if args.smoke else 30.0)
    factors = [1.0, 2.0, 3.0, 5.0]
    client = "inproc" if args.smoke else args.client
    rows: list[Row] = []
    for mode, fs in (("admission", factors), ("expiry", factors), ("admission+prio", [3.0])):
        dep = _deployment(mode, args.grace_ms)
        hi = 0.1 if mode == "admission+prio" else 0.0
        http = client == "http"
        drive = http_drive(seconds, hi, SLO_S) if http else inproc_drive(seconds, hi)
        rows += run_loop(run_rows(mode, dep, PLAN, fs, CAPACITY_QPS, LATE_SLACK_S, drive, http))
    if args.smoke:  # the HTTP path too, once
        dep = _deployment("admission", args.grace_ms)
        drive = http_drive(seconds, 0.0, SLO_S)
        mode = "admission/http"
        rows += run_loop(run_rows(mode, dep, PLAN, [1.0], CAPACITY_QPS, LATE_SLACK_S, drive, True))
    note = "not run (--no-triton)" if args.triton is False else "not run (--smoke; --triton)"
    if args.triton or (args.triton is None and not args.smoke):
        from _admission_triton import triton_rows

        extra, note = triton_rows(factors, seconds, CAPACITY_QPS, SLO_S, Row)
        rows += extra
    _print(rows, seconds, CLIENT_NOTES[client], note)
    print(
        "reproduce: .venv/bin/python benchmarks/admission.py"
        + (" --smoke" if args.smoke else f" --seconds {seconds:g}")
        + {True: " --triton" if args.smoke else "", False: " --no-triton", None: ""}[args.triton]
        + (f" --client {args.client}" if args.client != "http" and not args.smoke else "")
        + (f" --grace-ms {args.grace_ms:g}" if args.grace_ms != LATE_SLACK_S * 1e3 else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

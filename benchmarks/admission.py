"""Admission by predicted completion vs today's expiry under overload (issue 45).

One model, the bundled runtime's ``sleep`` example (10 ms per batch plus 1 ms per item), one
replica, batches up to 8 (capacity 8 / 18 ms = 444 q/s), a 100 ms SLO. Poisson arrivals at
1x, 2x, 3x and 5x that capacity, each for ``--seconds`` (30 by default), through the
``Service`` the HTTP route calls (``Service.predict``, in this process; the replica is its
own process, reached over gRPC). Rows:

- ``admission``: ``"queue": {"admission": "predicted", "expire_grace_ms": 5}`` (refused at
  once when predicted late; dropped from the queue as soon as it is doomed, or when a batch
  cut finds it late; answered DeadlineExceeded, counted in ``expired``, when its batch still
  runs 5 ms past its deadline: ``--grace-ms``),
- ``expiry``: today's ``"expire_late": true`` with the default 50 ms grace,
- ``admission+prio`` at 3x: 10% of the queries at priority 1.

Columns: offered rate; goodput (predictions answered within the SLO, per second) and its
share of the goodput measured at 1x with admission; answers later than deadline + 5 ms;
refusals (429 on the native route) and their P99 time to answer; the P99 of predictions;
how late the client's loop woke for its arrivals (P99; client and server share this process's
loop); ``srv late``: answers the server finished past deadline + 5 ms (queue delay plus the
batch's run, from the dispatcher's BatchEvents) and ``overran``: those whose batch ran past
admission's predicted completion. ``late`` minus ``srv late`` is the client's own lag.

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
import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core import DeadlineExceededError, ModelConfig, OverloadedError, Plan
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, start_service
from inferline.queueing import BatchEvent

SLO_S = 0.100
CAPACITY_QPS = 8 / 0.018
LATE_SLACK_S = 0.005
PLAN = Plan("sleep", SLO_S, {"m": ModelConfig("cpu", 8, 1)})


@dataclass
class Row:
    mode: str
    factor: float
    offered_qps: float = 0.0
    seconds: float = 0.0
    ok: list[float] = field(default_factory=list)  # latency of each prediction
    refused: list[float] = field(default_factory=list)  # time to answer each refusal at arrival
    # time to answer each query dropped from the queue by Clockwork's rule at a batch cut
    dropped: list[float] = field(default_factory=list)
    expired: int = 0
    errors: int = 0
    hi_ok: int = 0  # priority class: predictions within the SLO
    hi_total: int = 0
    # how late the client's loop woke for each arrival (client and server share this loop)
    lag: list[float] = field(default_factory=list)
    # answers the server finished later than deadline + 5 ms (queue delay + the batch's run,
    # from the dispatcher's BatchEvents), and of those the ones whose batch ran past its
    # predicted completion: the rest of ``late`` is the client seeing an in-time answer late
    srv_late: int = 0
    srv_late_overran: int = 0

    @property
    def goodput_qps(self) -> float:
        return sum(x <= SLO_S for x in self.ok) / self.seconds

    @property
    def late(self) -> int:
        return sum(x > SLO_S + LATE_SLACK_S for x in self.ok)


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


async def _one(svc: Any, row: Row, x: list[float], prio: int) -> None:
    t = time.perf_counter()
    try:
        await svc.predict("app", x, None, prio)
    except OverloadedError as e:  # PredictedLate is one
        late_drop = getattr(e, "stage", "") == "dispatch"  # at a cut or once doomed
        (row.dropped if late_drop else row.refused).append(time.perf_counter() - t)
        if prio:
            row.hi_total += 1
        return
    except DeadlineExceededError:
        row.expired += 1
        if prio:
            row.hi_total += 1
        return
    except Exception:
        row.errors += 1
        return
    lat = time.perf_counter() - t
    row.ok.append(lat)
    if prio:
        row.hi_total += 1
        row.hi_ok += lat <= SLO_S


async def _drive(svc: Any, row: Row, rate: float, seconds: float, hi_share: float) -> None:
    """Poisson arrivals at ``rate`` for ``seconds``; each query a task, awaited at the end."""
    rng = np.random.default_rng(45)
    n = int(rate * seconds * 1.2) + 10
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    times = times[times < seconds]
    prios = (rng.random(len(times)) < hi_share).astype(int)
    tasks = []
    t0 = time.perf_counter()
    i = 0
    while i < len(times):
        now = time.perf_counter() - t0
        while i < len(times) and times[i] <= now:
            tasks.append(asyncio.ensure_future(_one(svc, row, [float(i)], int(prios[i]))))
            i += 1
        if i < len(times):
            await asyncio.sleep(max(0.0, times[i] - (time.perf_counter() - t0)))
            row.lag.append(time.perf_counter() - t0 - times[i])
    await asyncio.gather(*tasks)
    row.offered_qps = len(times) / seconds
    row.seconds = seconds


async def _run_mode(mode: str, factors: list[float], seconds: float, grace_ms: float) -> list[Row]:
    svc = await start_service(_deployment(mode, grace_ms), PLAN)
    rows = []
    try:
        await svc.predict("app", [1.0])  # the replica's first call is its slowest
        for _ in range(30):  # batches of every size up to 8: the live P99 knows them
            await asyncio.gather(*(svc.predict("app", [1.0]) for _ in range(12)))
        current: list[Row] = []

        def on_event(ev: Any) -> None:
            if not current or not isinstance(ev, BatchEvent) or not ev.ok:
                return
            n = sum(d + ev.service_s > SLO_S + LATE_SLACK_S for d in ev.queue_delays_s)
            current[0].srv_late += n
            if n and ev.prediction_errors_s and min(ev.prediction_errors_s) < 0:
                current[0].srv_late_overran += n

        svc.dispatcher.add_listener(on_event)
        for f in factors:
            row = Row(mode, f)
            current[:] = [row]
            hi = 0.1 if mode == "admission+prio" else 0.0
            await _drive(svc, row, f * CAPACITY_QPS, seconds, hi)
            rows.append(row)
            await asyncio.sleep(0.3)  # let the backlog drain between rates
    finally:
        await svc.close()
    return rows


def _p99_ms(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) * 1e3 if xs else float("nan")


def _print(rows: list[Row], seconds: float, triton_note: str = "") -> bool:
    base = next(r for r in rows if r.mode == "admission" and r.factor == 1.0).goodput_qps
    print(
        f"Admission by predicted completion vs expiry: sleep model (10 ms + 1 ms/item), one "
        f"replica, batch 8, SLO {SLO_S * 1e3:.0f} ms, Poisson, {seconds:g} s per rate"
    )
    print(
        f"{'mode':<15} {'load':>5} {'offered/s':>9} {'goodput/s':>9} {'of 1x':>6} "
        f"{'late>+5ms':>9} {'refused':>8} {'refuse p99 ms':>13} {'dropped':>7} "
        f"{'drop p99 ms':>11} {'expired':>7} {'ok p99 ms':>9} {'hi on-time':>10} "
        f"{'loop lag p99 ms':>15} {'max':>5} {'srv late':>8} {'overran':>7}"
    )
    for r in rows:
        hi = f"{r.hi_ok / r.hi_total:.3f}" if r.hi_total else "-"
        print(
            f"{r.mode:<15} {r.factor:>4g}x {r.offered_qps:>9.0f} {r.goodput_qps:>9.0f} "
            f"{r.goodput_qps / base:>6.2f} {r.late:>9} {len(r.refused):>8} "
            f"{_p99_ms(r.refused):>13.2f} {len(r.dropped):>7} {_p99_ms(r.dropped):>11.1f} "
            f"{r.expired:>7} {_p99_ms(r.ok):>9.1f} {hi:>10} {_p99_ms(r.lag):>15.1f} "
            f"{max(r.lag, default=float('nan')) * 1e3:>5.0f} "
            f"{r.srv_late:>8} {r.srv_late_overran:>7}"
        )
    if triton_note:
        print(f"triton REJECT   -     {triton_note}")
    adm = [r for r in rows if r.mode == "admission" and r.factor >= 2]
    good = all(r.goodput_qps >= 0.95 * base for r in adm)
    no_late = all(r.late == 0 for r in rows if r.mode.startswith("admission"))
    fast = all(_p99_ms(r.refused) <= 2.0 for r in adm if r.refused)
    prio = [r for r in rows if r.mode == "admission+prio"]
    hi_ok = all(r.hi_total and r.hi_ok / r.hi_total >= 0.99 for r in prio)
    print(
        f"targets: goodput at 2x-5x >= 95% of 1x: {'met' if good else 'NOT met'}; "
        f"no answer later than deadline + 5 ms with admission: {'met' if no_late else 'NOT met'}; "
        f"refusals at arrival within 2 ms at P99: {'met' if fast else 'NOT met'}; "
        f"priority class on time >= 99% at 3x: {'met' if hi_ok else 'NOT met'}"
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
        "--grace-ms",
        type=float,
        default=LATE_SLACK_S * 1e3,
        help="admission rows: queue.expire_grace_ms, past which a batch still running is "
        "answered DeadlineExceeded, not awaited (5: the late column's slack)",
    )
    args = ap.parse_args(argv)
    seconds = args.seconds or (2.0 if args.smoke else 30.0)
    factors = [1.0, 2.0, 3.0, 5.0]
    rows: list[Row] = []
    for mode, fs in (("admission", factors), ("expiry", factors), ("admission+prio", [3.0])):
        rows += asyncio.run(_run_mode(mode, fs, seconds, args.grace_ms))
    note = "not run (--smoke; --triton to include it)"
    if args.triton or (args.triton is None and not args.smoke):
        from _admission_triton import triton_rows

        extra, note = triton_rows(factors, seconds, CAPACITY_QPS, SLO_S, Row)
        rows += extra
    _print(rows, seconds, note)
    print(
        "reproduce: .venv/bin/python benchmarks/admission.py"
        + (" --smoke" if args.smoke else f" --seconds {seconds:g}")
        + {True: " --triton" if args.smoke else "", False: " --no-triton", None: ""}[args.triton]
        + (f" --grace-ms {args.grace_ms:g}" if args.grace_ms != LATE_SLACK_S * 1e3 else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

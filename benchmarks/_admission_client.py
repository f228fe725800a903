"""The load client of ``benchmarks/admission.py``, in a process of its own (issue 45).

Run by the benchmark as ``python benchmarks/_admission_client.py --url ... --rate ...``: it
sends Poisson arrivals at ``--rate`` for ``--seconds`` to ``POST /apps/app/predict`` over real
HTTP/1.1 sockets (``inferline.measure``'s open-loop replay client: keep-alive connections,
protocol callbacks, no task per query, uvloop) and prints one JSON object on stdout: the
latency of each prediction, the time to answer each refusal at arrival and each dispatch drop,
counts of expired answers and errors, the priority class's outcomes and how late the client
sent. Latency counts from each query's scheduled arrival (a client that fell behind shows as
latency). Nothing is pickled: the benchmark reads the JSON.

Why a process of its own: with client and server on one event loop the client's 1,000-2,000
sends a second, and its own garbage, froze the server's loop (docs/deadlines.md)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

import numpy as np

from inferline.measure import replay
from inferline.server import run_loop

SEED = 45  # the arrivals of every row (and the Triton rows': same seed, same draw)


def arrivals(rate: float, seconds: float, hi_share: float) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrival times in ``[0, seconds)`` and each query's priority (1 with
    probability ``hi_share``, else 0)."""
    rng = np.random.default_rng(SEED)
    n = int(rate * seconds * 1.2) + 10
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    times = times[times < seconds]
    prios = (rng.random(len(times)) < hi_share).astype(int)
    return times, prios


def _bodies(prios: np.ndarray) -> list[bytes]:
    # one body per query (replay sends bodies[i]); the input is the query's index, as before
    return [
        json.dumps({"input": [float(i)], "priority": int(p)}, separators=(",", ":")).encode()
        for i, p in enumerate(prios)
    ]


class _Outcomes:
    """What each answer was, from its status and body (the 429's ``reason`` tells a refusal
    at arrival, ``predicted_late``, from a dispatch drop, ``dropped_late``)."""

    def __init__(self, n: int) -> None:
        self.kind = np.zeros(n, dtype=np.int8)  # 0 none, 1 ok, 2 refused, 3 dropped, 4 expired

    def __call__(self, i: int, status: int, body: bytes) -> None:
        if status == 200:
            self.kind[i] = 1
        elif status == 429:
            self.kind[i] = 3 if b"dropped_late" in body else 2
        elif status == 504:
            self.kind[i] = 4


def _summary(res: Any, kinds: np.ndarray, prios: np.ndarray, slo_s: float) -> dict[str, Any]:
    lat = res.latency_s
    hi = prios == 1

    def times(k: int) -> list[float]:
        return [round(float(x), 6) for x in lat[kinds == k]]

    lag = res.send_lag_s
    ok_hi = (kinds == 1) & hi
    return {
        "offered": int(res.n),
        "ok": times(1),
        "refused": times(2),
        "dropped": times(3),
        "expired": int((kinds == 4).sum()),
        "errors": int((kinds == 0).sum()),
        "error_kinds": {str(k): int(v) for k, v in res.error_kinds.items()},
        "hi": {
            "total": int(hi.sum()),
            "on_time": int((ok_hi & (lat <= slo_s)).sum()),
            "late": int((ok_hi & (lat > slo_s)).sum()),
            "refused": int(((kinds == 2) & hi).sum()),
            "dropped": int(((kinds == 3) & hi).sum()),
            "expired": int(((kinds == 4) & hi).sum()),
            "errors": int(((kinds == 0) & hi).sum()),
        },
        "lag_p99_s": float(np.percentile(lag, 99)) if lag.size else 0.0,
        "lag_max_s": float(lag.max()) if lag.size else 0.0,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    times, prios = arrivals(args.rate, args.seconds, args.hi_share)
    outcomes = _Outcomes(len(times))
    bodies = _bodies(prios)
    gc.collect()
    gc.freeze()  # the bodies and the imports leave the collector: no long pause mid-run
    cpu = time.process_time()
    res = await replay(
        times, args.url, "app", bodies, slo_s=args.slo_s, connections=64, on_answer=outcomes
    )
    out = _summary(res, outcomes.kind, prios, args.slo_s)
    out["cpu_s"] = time.process_time() - cpu  # this process's CPU over the run
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="the server, http://host:port")
    ap.add_argument("--rate", type=float, required=True, help="queries per second")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--hi-share", type=float, default=0.0, help="share at priority 1")
    ap.add_argument("--slo-s", type=float, required=True)
    args = ap.parse_args(argv)
    out = run_loop(_run(args))
    out["seconds"] = args.seconds
    json.dump(out, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

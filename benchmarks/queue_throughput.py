"""In-process throughput of the interposed queue (Dispatcher) with a no-op model.

What is measured: queries per second through ``Dispatcher.submit`` -> EDF queue -> puller ->
``InProcessReplica`` (no-op container, zero service time but one yield to the event loop, as an
RPC would) -> result, on one asyncio loop, with a closed loop of ``window`` outstanding queries
per run. Modes:

* ``submit_many``: a client hands the queue ``window`` queries per call (the frontend's batch
  form); the queue's own cost per query.
* ``submit``: one task per query (``asyncio.gather`` of ``submit`` coroutines), like one HTTP
  request per query; includes asyncio's task cost.
* ``pipeline``: ``PipelineRunner.run`` of a one-model pipeline, one task per query.

Target (issue 3): at least 50,000 queries/s with batching. Run:
``.venv/bin/python benchmarks/queue_throughput.py [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import sys
import time
from typing import Any

from inferline.queueing import (
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    PipelineRunner,
)

TARGET_QPS = 50_000


async def _one_run(mode: str, max_batch: int, replicas: int, n: int, window: int) -> dict[str, Any]:
    d = Dispatcher()
    d.add_model("noop", batching=FixedBatching(max_batch), max_queue=max(10_000, 2 * window))
    reps = [InProcessReplica("noop", NoOpModel(), service_s=0.0) for _ in range(replicas)]
    d.set_replicas("noop", reps)

    async def pipe(x: Any, ctx: PipelineContext) -> Any:
        return await ctx.predict("noop", x)

    runner = PipelineRunner(d, pipe, slo_s=1.0)
    xs = list(range(window))
    done = 0
    gc.collect()
    t0 = time.perf_counter()
    while done < n:
        k = min(window, n - done)
        deadline = time.monotonic() + 1.0
        if mode == "submit_many":
            outs = await d.submit_many("noop", xs[:k], deadline=deadline)
        elif mode == "submit":
            outs = await asyncio.gather(*(d.submit("noop", x, deadline=deadline) for x in xs[:k]))
        else:
            outs = await asyncio.gather(*(runner.run(x) for x in xs[:k]))
        assert len(outs) == k and outs[-1] == k - 1
        done += k
    dt = time.perf_counter() - t0
    st = d.stats("noop")
    await d.close()
    assert st.completed == n and st.failed == 0
    return {
        "mode": mode,
        "max_batch": max_batch,
        "replicas": replicas,
        "window": window,
        "queries": n,
        "seconds": dt,
        "qps": n / dt,
        "mean_batch": st.mean_batch_size,
        "us_per_query": dt / n * 1e6,
    }


def run(quick: bool, repeats: int) -> list[dict[str, Any]]:
    n = 20_000 if quick else 200_000
    configs = [
        ("submit_many", 1, 1, 1000),
        ("submit_many", 64, 1, 1000),
        ("submit_many", 64, 2, 1000),
        ("submit", 1, 1, 1000),
        ("submit", 64, 1, 1000),
        ("submit", 64, 2, 1000),
        ("pipeline", 64, 2, 1000),
    ]
    if quick:
        configs = [c for c in configs if c[1] == 64]
    rows = []
    for mode, mb, r, w in configs:
        best: dict[str, Any] | None = None
        for _ in range(repeats):  # best of a few: the machine is shared and noisy
            res = asyncio.run(_one_run(mode, mb, r, n, w))
            if best is None or res["qps"] > best["qps"]:
                best = res
        assert best is not None
        rows.append(best)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer queries and configurations")
    ap.add_argument("--smoke", action="store_true", help="the same as --quick (a few seconds)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per row (best is shown)")
    args = ap.parse_args(argv)
    args.quick |= args.smoke
    repeats = args.repeats or (2 if args.quick else 3)
    rows = run(args.quick, repeats)
    print(
        f"In-process queue throughput (no-op model, python {platform.python_version()}, "
        f"best of {repeats})"
    )
    print(
        f"{'mode':<12} {'max_batch':>9} {'replicas':>8} {'window':>6} {'queries':>8} "
        f"{'q/s':>10} {'us/query':>9} {'mean batch':>10}"
    )
    for r in rows:
        print(
            f"{r['mode']:<12} {r['max_batch']:>9} {r['replicas']:>8} {r['window']:>6} "
            f"{r['queries']:>8} {r['qps']:>10,.0f} {r['us_per_query']:>9.2f} "
            f"{r['mean_batch']:>10.1f}"
        )
    batched = [r for r in rows if r["max_batch"] > 1]
    best = max(batched, key=lambda r: r["qps"])
    ok = best["qps"] >= TARGET_QPS
    print(
        f"target >= {TARGET_QPS:,} q/s with batching: best {best['qps']:,.0f} q/s "
        f"({best['mode']}) -> {'met' if ok else 'NOT met'}"
    )
    print(
        "reproduce: .venv/bin/python benchmarks/queue_throughput.py"
        + (" --smoke" if args.smoke else " --quick" if args.quick else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

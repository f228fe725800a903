"""Data-path figures of the HTTP frontend, with a no-op model.

* HTTP throughput: the most queries/s the frontend answers (closed loop, several client
  concurrencies; the best is reported). Target: at least 3,000 q/s.
* Added latency: P50/P99 of the full HTTP round trip at half that throughput, open loop
  (the replay client, fired at a gamma trace with CV 1). Target: P99 at most 2 ms.
* The same two figures through the bundled runtime's no-op replica over gRPC (``local://``)
  with batching, for reference: that adds the RPC hop a real model pays.
* The in-process queue's throughput: ``benchmarks/queue_throughput.py --quick`` when present.

The server runs in its own process (``--serve MODE``); the client in this one. On the 2-core
machine the two share the cores with everything else running, so figures are noisy: each is
the best or median of a few runs, as stated in the table.

    .venv/bin/python benchmarks/frontend.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
LOW_RATE = 300.0  # a rate far from saturation: the per-query cost of the layer alone
TARGET_QPS = 3000.0


# ---------------------------------------------------------------- server side


def serve(mode: str, port_file: str) -> None:
    """Serve app ``noop`` in this process: an in-process no-op replica behind the queue
    (``inproc``), or a ``local://`` no-op replica process (``local``)."""
    from inferline.core import ModelConfig, ModelSpec
    from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica, NoOpModel
    from inferline.server import App, Service, bind_socket, create_app, run_loop, serve_app

    async def main() -> None:
        d = Dispatcher()
        d.add_model("noop", batching=FixedBatching(32), max_queue=100_000)
        backend = None
        if mode == "inproc":
            d.set_replicas("noop", [InProcessReplica("noop", NoOpModel(), service_s=0.0)])
        else:
            from inferline.adapters.local import LocalBackend

            backend = LocalBackend(oversubscribe=True)
            await backend.deploy(
                ModelSpec("noop", "inferline.adapters.local.examples:noop"),
                ModelConfig("cpu", 32, 1),
            )
            d.attach(backend)

        async def pipeline(x, ctx):
            return await ctx.predict("noop", x)

        svc = Service(
            [App.from_pipeline("noop", pipeline, d, 1.0)],
            dispatcher=d,
            backend=backend,
            models=["noop"],
        )
        sock = bind_socket("127.0.0.1", 0)

        def ready() -> None:
            tmp = port_file + ".tmp"
            Path(tmp).write_text(str(sock.getsockname()[1]))
            os.replace(tmp, port_file)

        await serve_app(create_app(svc), sock, ready=ready)

    run_loop(main())


class Server:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.tmp = tempfile.TemporaryDirectory()
        self.port_file = os.path.join(self.tmp.name, "port")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> str:
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", self.mode, "--port-file", self.port_file],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + 120
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace")[-2000:]
                self.__exit__()
                raise RuntimeError(
                    f"benchmark server ({self.mode}) did not start; its stderr:\n{tail}"
                )
            time.sleep(0.05)
        return f"http://127.0.0.1:{Path(self.port_file).read_text()}"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.tmp.cleanup()


# ---------------------------------------------------------------- client side


def measure(url: str, server_pid: int, size: str = "full") -> dict[str, Any]:
    """The figures for one server; ``size``: ``full``, ``quick`` or ``smoke`` (a few seconds:
    0.5 s runs, one closed-loop run at the best concurrency instead of three)."""
    import psutil

    from inferline.measure import closed_loop, encode_bodies, replay
    from inferline.server import run_loop

    bodies = encode_bodies([[0.5] * 8, [1.0] * 8, [0.0] * 8])
    dur = {"smoke": 0.5, "quick": 2.0}.get(size, 4.0)
    n_runs = 1 if size == "smoke" else 3
    proc = psutil.Process(server_pid)

    def cpu() -> float:
        t = proc.cpu_times()
        return t.user + t.system

    async def main() -> dict[str, Any]:
        # warm up (imports, connections, first requests)
        await closed_loop(url, "noop", bodies, concurrency=8, duration_s=min(0.5, dur / 2))
        scan = []
        for conc in (8, 16, 32):
            r = await closed_loop(url, "noop", bodies, concurrency=conc, duration_s=dur / 2)
            scan.append((r["qps"] * r["ok_fraction"], conc))
        conc = max(scan)[1]
        runs = []
        answered = 0.0
        c0 = cpu()
        for _ in range(n_runs):
            r = await closed_loop(url, "noop", bodies, concurrency=conc, duration_s=dur)
            runs.append(r["qps"] * r["ok_fraction"])
            answered += r["answered"]
        cpu_us = (cpu() - c0) / answered * 1e6
        qps = float(np.median(runs))

        async def open_loop(rate: float, seed: int) -> tuple[Any, float]:
            n = max(50, int(rate * dur))
            trace = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))
            me = psutil.Process()
            m0 = me.cpu_times()
            res = await replay(trace, url, "noop", bodies, connections=64)
            m1 = me.cpu_times()
            return res, ((m1.user - m0.user) + (m1.system - m0.system)) / res.n * 1e6

        out: dict[str, Any] = {
            "throughput_qps": qps,
            "throughput_runs": runs,
            "concurrency": float(conc),
            "server_cpu_us_per_query": cpu_us,
            "open_loop": {},
        }
        for k, (name, rate) in enumerate(
            (("low", LOW_RATE), ("half_target", TARGET_QPS / 2), ("half_max", qps / 2))
        ):
            res, client_us = await open_loop(rate, k)
            out["open_loop"][name] = {
                "rate_qps": rate,
                "p50_ms": res.percentile(50) * 1e3,
                "p99_ms": res.percentile(99) * 1e3,
                # from the actual send: the layer's own latency, without the client's lag
                "sent_p50_ms": float(np.percentile(res.done_s - res.sent_s, 50)) * 1e3,
                "sent_p99_ms": float(np.percentile(res.done_s - res.sent_s, 99)) * 1e3,
                "errors": int((res.status != 200).sum()),
                "send_lag_p99_ms": float(np.percentile(res.send_lag_s, 99)) * 1e3,
                "client_cpu_us_per_query": client_us,
            }
        return out

    return run_loop(main())  # type: ignore[no-any-return]


def queue_figures(size: str) -> str:
    script = HERE / "queue_throughput.py"
    if not script.exists():
        return "benchmarks/queue_throughput.py not present: in-process queue figure not measured"
    r = subprocess.run(
        [sys.executable, str(script), *([f"--{size}"] if size != "full" else [])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return (
        r.stdout.strip() if r.returncode == 0 else f"queue_throughput.py failed: {r.stderr[-500:]}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="shorter runs (2 s instead of 4 s), queue_throughput.py --quick",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a few seconds: 0.5 s runs, one closed-loop run, queue_throughput.py --smoke",
    )
    ap.add_argument("--serve", choices=["inproc", "local"], help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run at this niceness (the server inherits it); negative: priority over other "
        "work on a shared machine (root only)",
    )
    args = ap.parse_args()
    if args.nice and not args.serve:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    if args.serve:
        serve(args.serve, args.port_file)
        return 0
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    results = {}
    import os as _os

    load = _os.getloadavg()[0]
    for mode in ("inproc", "local"):
        srv = Server(mode)
        with srv as url:
            results[mode] = measure(url, srv.pid, size)
    print()
    print("HTTP frontend, no-op model (server and client are separate processes on this machine)")
    cols = (("low", "@300 q/s"), ("half_target", "@1500 q/s"), ("half_max", "@max/2"))
    print(
        f"{'path':<46}{'max q/s':>8}{'CPU us/q':>9}"
        + "".join(f"{'P50/P99 ms ' + c:>24}" for _, c in cols)
    )
    names = {
        "inproc": "HTTP + queue + in-process no-op replica",
        "local": "HTTP + queue + local:// no-op replica (gRPC)",
    }
    for mode, r in results.items():
        ol = r["open_loop"]
        cells = "".join(f"{ol[k]['p50_ms']:>13.2f} / {ol[k]['p99_ms']:<8.2f}" for k, _ in cols)
        print(
            f"{names[mode]:<46}{r['throughput_qps']:>8.0f}{r['server_cpu_us_per_query']:>9.0f}"
            + cells
        )
    ip = results["inproc"]
    ht = ip["open_loop"]["half_target"]
    print()
    print(
        f"targets: throughput >= 3000 q/s -> {ip['throughput_qps']:.0f} "
        f"({'met' if ip['throughput_qps'] >= 3000 else 'NOT met'}); "
        f"P99 added at 1500 q/s <= 2 ms -> {ht['p99_ms']:.2f} ms "
        f"({'met' if ht['p99_ms'] <= 2.0 else 'NOT met'})"
    )
    print(
        "  same, timed from each request's actual send (excludes the client's own lag): "
        + ", ".join(
            f"{c}: {ip['open_loop'][k]['sent_p50_ms']:.2f} / {ip['open_loop'][k]['sent_p99_ms']:.2f} ms"
            for k, c in cols
        )
    )
    cu = ht["client_cpu_us_per_query"]
    print(f"replay client: {cu:.0f} CPU-us per query (one core: ~{1e6 / cu:.0f} q/s)")
    print(
        f"max q/s: median of {1 if args.smoke else 3} closed-loop runs at the best client concurrency (status 200"
    )
    print("only); CPU us/q: server CPU time per query in those runs; P50/P99: open-loop replay")
    print("(gamma CV 1) at 300 q/s, at 1500 q/s (half the target) and at half the measured max,")
    print("measured by the client from each query's scheduled send time (its own HTTP handling")
    print(f"included). 1-minute load average at the start: {load:.1f} on {_os.cpu_count()} cores.")
    print()
    print("in-process queue:")
    print(queue_figures(size))
    print()
    flag = f" --{size}" if size != "full" else ""
    print(f"reproduce: .venv/bin/python benchmarks/frontend.py{flag}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

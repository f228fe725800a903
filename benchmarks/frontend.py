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
import contextlib
import json
import os
import signal
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
RAY_SERVE_PY = HERE.parent / ".cache" / "ray-serve-venv" / "bin" / "python"
PEER_FACTOR = 4.0  # issue 44: the door's throughput at least 4x Ray Serve's proxy's


# ---------------------------------------------------------------- server side


def serve(mode: str, port_file: str, door_workers: int = 0) -> None:
    """Serve app ``noop`` in this process: an in-process no-op replica behind the queue
    (``inproc``), or a ``local://`` no-op replica process (``local``); also over KServe v2
    (``/v2/models/noop/infer``). ``door_workers``: HTTP door worker processes in front."""
    from inferline.core import ModelConfig, ModelSpec
    from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica, NoOpModel
    from inferline.server import App, Service, bind_socket, create_app, run_loop, serve_app
    from inferline.server.frontdoors import make_kserve_router

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
        workers = door_workers > 0
        sock = bind_socket("127.0.0.1", 0, reuse_port=workers, listen=not workers)

        def ready() -> None:
            tmp = port_file + ".tmp"
            Path(tmp).write_text(str(sock.getsockname()[1]))
            os.replace(tmp, port_file)

        app = create_app(svc, routers=[make_kserve_router(svc)])
        await serve_app(app, sock, ready=ready, door_workers=door_workers)

    run_loop(main())


class Server:
    def __init__(self, mode: str, door_workers: int = 0) -> None:
        self.mode = mode
        self.door_workers = door_workers
        self.tmp = tempfile.TemporaryDirectory()
        self.port_file = os.path.join(self.tmp.name, "port")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command(self) -> list[str]:
        if self.mode == "ray-serve":  # the peer, in Ray Serve's own environment
            return [
                str(RAY_SERVE_PY),
                str(HERE / "_ray_serve_noop.py"),
                "--port-file",
                self.port_file,
            ]
        return [
            sys.executable,
            __file__,
            "--serve",
            self.mode,
            "--port-file",
            self.port_file,
            "--door-workers",
            str(self.door_workers),
        ]

    def __enter__(self) -> str:
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+b")
        # its own session: Ray's processes (GCS, raylet, workers) go down with the group
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True
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
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # what Ray left behind in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        self.tmp.cleanup()


# ---------------------------------------------------------------- client side


def measure(
    url: str, server_pid: int, size: str = "full", whole_tree: bool = False
) -> dict[str, Any]:
    """The figures for one server; ``size``: ``full``, ``quick`` or ``smoke`` (a few seconds:
    0.5 s runs, one closed-loop run at the best concurrency instead of three); ``whole_tree``:
    count the CPU of all the server's descendants (the Ray Serve peer)."""
    import psutil

    from inferline.measure import closed_loop, encode_bodies, replay
    from inferline.server import run_loop

    bodies = encode_bodies([[0.5] * 8, [1.0] * 8, [0.0] * 8])
    dur = {"smoke": 0.5, "quick": 2.0}.get(size, 4.0)
    n_runs = 1 if size == "smoke" else 3
    proc = psutil.Process(server_pid)

    def cpu() -> float:
        return server_cpu_s(proc, whole_tree)

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


def server_cpu_s(proc: Any, whole_tree: bool = False) -> float:
    """CPU seconds of the server process and its door worker processes (not its replicas);
    ``whole_tree``: every descendant (Ray Serve's proxy, controller, replica, raylet, GCS)."""
    if whole_tree:
        import psutil

        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total
    return sum(server_cpu_split(proc))


def server_cpu_split(proc: Any) -> tuple[float, float]:
    """CPU seconds of the server (queue) process, and of its door worker processes."""
    import psutil

    main = workers = 0.0
    for p in [proc, *proc.children()]:
        try:
            if p is not proc and "inferline.server._door_worker" not in p.cmdline():
                continue
            t = p.cpu_times()
        except psutil.Error:
            continue
        if p is proc:
            main += t.user + t.system
        else:
            workers += t.user + t.system
    return main, workers


# ---------------------------------------------------------------- door workers (issue 44.3)

KSERVE_PATH = "/v2/models/noop/infer"
KSERVE_BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
).encode()


async def kserve_closed_loop(url: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    """KServe v2 JSON infer requests, ``concurrency`` keep-alive connections each sending as
    soon as answered (a raw-socket client: little CPU per request, as perf_analyzer's C++)."""
    import asyncio

    host, port = url.split("//", 1)[1].split(":")
    head = (
        f"POST {KSERVE_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(KSERVE_BODY)}\r\n\r\n"
    )
    request = head.encode() + KSERVE_BODY
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    bad = 0
    stop_at = loop.time() + duration_s
    done = loop.create_future()
    open_conns = concurrency

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t, self.buf = transport, b""
            self.send()

        def send(self) -> None:
            self.sent = loop.time()
            self.t.write(request)

        def data_received(self, data: bytes) -> None:
            nonlocal bad, open_conns
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = int(self.buf.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            status = int(self.buf[9:12])
            self.buf = self.buf[end + 4 + length :]
            lat.append(loop.time() - self.sent)
            bad += status != 200
            if loop.time() < stop_at:
                self.send()
            else:
                self.t.close()
                open_conns -= 1
                if open_conns == 0 and not done.done():
                    done.set_result(None)

    t0 = loop.time()
    for _ in range(concurrency):
        await loop.create_connection(Conn, host, int(port))
    await done
    elapsed = loop.time() - t0
    return {
        "qps": (len(lat) - bad) / elapsed,
        "errors": bad,
        "answered": len(lat),
        "p50_ms": float(np.percentile(lat, 50)) * 1e3,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3,
    }


def measure_workers(url: str, server_pid: int, dur: float) -> dict[str, Any]:
    """Per route (native predict, KServe v2 JSON): closed-loop throughput at concurrency 32,
    its P50/P99, and the server's CPU (queue process + door workers) per answered query."""
    import psutil

    from inferline.measure import closed_loop, encode_bodies
    from inferline.server import run_loop

    proc = psutil.Process(server_pid)
    bodies = encode_bodies([[0.5] * 8, [1.0] * 8, [0.0] * 8])

    async def main() -> dict[str, Any]:
        await closed_loop(url, "noop", bodies, concurrency=8, duration_s=0.5)  # warm up
        await kserve_closed_loop(url, 8, 0.5)
        c0 = server_cpu_split(proc)
        r = await closed_loop(url, "noop", bodies, concurrency=32, duration_s=dur)
        c1 = server_cpu_split(proc)
        k = await kserve_closed_loop(url, 32, dur)
        c2 = server_cpu_split(proc)

        def per_query(a: tuple[float, float], b: tuple[float, float], n: float) -> dict:
            return {
                "cpu_us": (sum(b) - sum(a)) / max(1, n) * 1e6,
                "queue_cpu_us": (b[0] - a[0]) / max(1, n) * 1e6,
            }

        return {
            "native": {"qps": r["qps"] * r["ok_fraction"], **per_query(c0, c1, r["answered"])},
            "kserve": {**k, **per_query(c1, c2, k["answered"])},
        }

    return run_loop(main())  # type: ignore[no-any-return]


def compare_workers(counts: list[int], rounds: int, dur: float) -> list[dict[str, Any]]:
    """``measure_workers`` for each door worker count, ``rounds`` times, the order reversed
    every other round (so that other work on a shared machine hits every count alike)."""
    rows = []
    for rnd in range(rounds):
        for n in counts if rnd % 2 == 0 else counts[::-1]:
            srv = Server("inproc", n)
            with srv as url:
                r = measure_workers(url, srv.pid, dur)
            rows.append({"round": rnd, "door_workers": n, "load": os.getloadavg()[0], **r})
            k, nat = r["kserve"], r["native"]
            print(
                f"round {rnd} door workers {n}: KServe {k['qps']:.0f} q/s (P50 {k['p50_ms']:.1f} "
                f"P99 {k['p99_ms']:.1f} ms, CPU-us/q {k['cpu_us']:.0f} of which queue process "
                f"{k['queue_cpu_us']:.0f}), native {nat['qps']:.0f} q/s (CPU-us/q "
                f"{nat['cpu_us']:.0f}, queue process {nat['queue_cpu_us']:.0f}), "
                f"load {rows[-1]['load']:.1f}",
                flush=True,
            )
    return rows


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
    ap.add_argument(
        "--door-workers",
        default=None,
        help="compare door worker counts instead (e.g. 0,1,2,4): KServe v2 and native "
        "closed-loop throughput and server CPU per query, in-process no-op replica",
    )
    ap.add_argument("--rounds", type=int, default=2, help="with --door-workers: rounds")
    ap.add_argument(
        "--no-peer",
        action="store_true",
        help="skip the Ray Serve peer row (measured by default when .cache/ray-serve-venv "
        "exists, except with --smoke)",
    )
    ap.add_argument("--peer", action="store_true", help="with --smoke: measure the peer too")
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
        serve(args.serve, args.port_file, int(args.door_workers or 0))
        return 0
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.door_workers is not None:
        counts = [int(x) for x in args.door_workers.split(",")]
        dur = {"smoke": 0.5, "quick": 2.0}.get(size, 4.0)
        rows = compare_workers(counts, args.rounds, dur)
        print(
            f"on {os.cpu_count()} cores; reproduce: .venv/bin/python benchmarks/frontend.py "
            f"--door-workers {args.door_workers} --rounds {args.rounds}"
            + (f" --{size}" if size != "full" else "")
        )
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        return 0
    results = {}
    import os as _os

    load = _os.getloadavg()[0]
    modes = ["inproc", "local"]
    if args.no_peer or (size == "smoke" and not args.peer):
        why = "--no-peer" if args.no_peer else "--smoke; add --peer to include it"
        peer_note = f"Ray Serve peer: not measured ({why})"
    elif not RAY_SERVE_PY.exists():
        peer_note = f"Ray Serve peer: not measured ({RAY_SERVE_PY} missing; `make` makes it)"
    else:
        modes.append("ray-serve")
        peer_note = ""
    for mode in modes:
        srv = Server(mode)
        with srv as url:
            results[mode] = measure(url, srv.pid, size, whole_tree=mode == "ray-serve")
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
        "ray-serve": "Ray Serve 2.60 proxy + no-op (@serve.batch 32)",
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
    if "ray-serve" in results:
        rs = results["ray-serve"]["throughput_qps"]
        ratio = ip["throughput_qps"] / rs if rs > 0 else float("inf")
        print(
            f"  vs Ray Serve's proxy (same client, same route and body, no-op model): "
            f"{ip['throughput_qps']:.0f} / {rs:.0f} q/s = {ratio:.1f}x (target >= "
            f"{PEER_FACTOR:.0f}x: {'met' if ratio >= PEER_FACTOR else 'NOT met'}); "
            f"Ray Serve's CPU us/q counts all its processes (proxy, controller, replica, raylet)"
        )
    elif peer_note:
        print("  " + peer_note)
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

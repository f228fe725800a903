"""Estimator speed and exactness: the numba kernel against an independent SimPy model.

The SimPy model (:class:`SimpyReference`) implements docs/design.md's estimator contract with plain
SimPy processes: a source process, one process per replica, a heap per model for the EDF
queue, and dispatch callbacks scheduled at a priority below every ordinary event so that all
arrivals and completions of an instant are applied before any idle replica takes a batch. It
also models hop overhead, delayed batching, activation delay, replica schedules, wake-up extras
and the service spread. It shares nothing with the kernel except the visit draws
(``draw_visits``) and the definition of the spread's normal draws, both part of the contract. A visit with
repeated calls (``Pipeline.visits``) goes back to its model's queue as each call finishes
until the last, then on to its children.

Run: ``.venv/bin/python benchmarks/estimator.py`` (``--quick`` for a small version).
Prints, per case, SimPy time, estimator time, their ratio and the largest latency difference;
then the one-hour 100 q/s four-model linear case (warm time and one-off compile time).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from inferline.core import (
    BatchProfile,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    WakeProfile,
    draw_visits,
    gamma_trace,
    simulate,
)

__all__ = ["CASES", "SimpyReference", "compare", "main"]

_DISPATCH = 2  # below simpy's URGENT (0) and NORMAL (1): runs after every event of the instant


@dataclass(eq=False)
class _Replica:
    model: str
    go: object = None  # simpy Event fired with the batch to process
    state: str = "pending"  # pending | idle | busy | retiring | gone
    busy_until: float = math.inf
    service: float = 0.0  # of the batch in flight
    idle_since: float = -math.inf  # never served: cold


@dataclass
class _ModelState:
    queue: list[tuple[float, int]] = field(default_factory=list)  # (deadline key, query)
    enq: dict[int, float] = field(default_factory=dict)  # queued query -> time it entered
    idle: list[_Replica] = field(default_factory=list)
    replicas: list[_Replica] = field(default_factory=list)  # every replica, in request order
    dispatch_scheduled: bool = False
    wake_pending: bool = False
    batches: int = 0


class SimpyReference:
    """The estimator contract as a plain SimPy model (the benchmark's independent reference)."""

    def __init__(
        self,
        pipeline: Pipeline,
        configs: Mapping[str, ModelConfig],
        profiles: Profiles,
        arrivals: np.ndarray,
        *,
        options: EstimatorOptions | None = None,
        schedule: Sequence[tuple[float, str, int]] = (),
    ) -> None:
        import simpy

        self.simpy = simpy
        self.p = pipeline
        self.cfg = configs
        self.prof = profiles
        self.arr = np.asarray(arrivals, dtype=np.float64)
        self.opt = options or EstimatorOptions()
        self.schedule = sorted(schedule, key=lambda e: e[0])
        order = pipeline.topological_order
        vis = draw_visits(pipeline, len(self.arr), self.opt.seed)
        self.visits = [{m for j, m in enumerate(order) if vis[i, j]} for i in range(len(self.arr))]
        # repeated calls (Pipeline.visits): the calls of a visit still to make after this one
        self.more = {
            (int(i), order[j]): int(vis[i, j]) - 1
            for i, j in zip(*np.nonzero(vis > 1), strict=True)
        }
        self.pos = {m: j for j, m in enumerate(order)}
        # the spread's draws (EstimatorOptions.service_spread): visit (i, m) takes element
        # i * M + m of a standard normal stream seeded [seed, 1], clipped at the 99.9th pct
        clip = NormalDist().inv_cdf(0.999)
        z = np.random.default_rng([self.opt.seed, 1]).standard_normal(len(self.arr) * len(order))
        self.z = np.minimum(np.maximum(z, -clip), clip)
        t0 = min([float(self.arr[0]) if len(self.arr) else 0.0, *(e[0] for e in self.schedule)])
        self.env = simpy.Environment(initial_time=t0)
        self.models = {m: _ModelState() for m in pipeline.models}
        self.finish = np.full(len(self.arr), -math.inf)
        self.left = [len(v) for v in self.visits]
        self.waiting: dict[tuple[int, str], int] = {}  # join: visited parents not yet done

    # -- time helpers ------------------------------------------------------------------------
    def _at(self, t: float, priority: int) -> object:
        """An event that fires at exactly time ``t`` (``now + delay`` rounded may miss it)."""
        env = self.env
        delay = t - env.now
        while env.now + delay < t:
            delay = math.nextafter(delay, math.inf)
        while env.now + delay > t:
            delay = math.nextafter(delay, -math.inf)
        ev = env.event()
        ev._ok = True  # a triggered event needs a value and an ok flag before it is scheduled
        ev._value = None
        env.schedule(ev, priority, delay)
        return ev

    def _call_at(self, t: float, priority: int, fn: object) -> None:
        ev = self._at(t, priority)
        ev.callbacks.append(lambda _e: fn())  # type: ignore[attr-defined]

    # -- queues ------------------------------------------------------------------------------
    def _enter(self, i: int, m: str) -> None:
        hop = self.opt.hop_overhead_s
        if hop > 0:
            ev = self.env.timeout(hop)
            ev.callbacks.append(lambda _e: self._enqueue(i, m))
        else:
            self._enqueue(i, m)

    def _enqueue(self, i: int, m: str) -> None:
        st = self.models[m]
        heapq.heappush(st.queue, (float(self.arr[i]), i))  # deadline = arrival + SLO
        st.enq[i] = self.env.now
        self._request_dispatch(m)

    def _request_dispatch(self, m: str) -> None:
        st = self.models[m]
        if not st.dispatch_scheduled:
            st.dispatch_scheduled = True
            self._call_at(self.env.now, _DISPATCH, lambda: self._dispatch(m))

    def _dispatch(self, m: str) -> None:
        st = self.models[m]
        st.dispatch_scheduled = False
        cfg = self.cfg[m]
        wait = float(self.opt.batch_wait_s.get(m, 0.0))
        now = self.env.now
        while st.idle and st.queue:
            if wait > 0 and len(st.queue) < cfg.max_batch_size:
                deadline = min(st.enq.values()) + wait
                if now < deadline:
                    if not st.wake_pending:
                        st.wake_pending = True
                        self._call_at(deadline, 1, lambda: self._wake(m))
                    return
            b = min(cfg.max_batch_size, len(st.queue))
            batch = [heapq.heappop(st.queue)[1] for _ in range(b)]
            for i in batch:
                del st.enq[i]
            rep = st.idle.pop()
            rep.state = "busy"
            rep.service = self._service(m, cfg.hardware, b, batch[0])
            wake = self.prof.wake(m, cfg.hardware) if self.opt.wake_up else None
            if wake is not None:  # the wake-up extra for the time it was idle
                rep.service += wake.extra(now - rep.idle_since)
            rep.busy_until = now + rep.service
            st.batches += 1
            rep.go.succeed(batch)  # type: ignore[attr-defined]

    def _service(self, m: str, hw: str, b: int, first: int) -> float:
        """The profiled latency, or with the spread the log-normal draw through p50 and p99
        with the normal of the batch's first query."""
        sizes = sorted(self.prof.models[m][hw])
        bp = self.prof.models[m][hw][next(x for x in sizes if x >= b)]
        if not self.opt.service_spread or bp.p50_s is None or bp.p99_s is None:
            return bp.latency_s
        if not 0 < bp.p50_s < bp.p99_s:
            return bp.latency_s
        sigma = math.log(bp.p99_s / bp.p50_s) / NormalDist().inv_cdf(0.99)
        return bp.p50_s * math.exp(sigma * self.z[first * len(self.pos) + self.pos[m]])

    def _wake(self, m: str) -> None:
        self.models[m].wake_pending = False
        self._request_dispatch(m)

    # -- processes ---------------------------------------------------------------------------
    def _source(self):  # type: ignore[no-untyped-def]
        roots = self.p.roots
        for i, a in enumerate(self.arr):
            if self.env.now < a:
                yield self._at(float(a), 1)
            if not self.visits[i]:
                self.finish[i] = a
                continue
            for m in roots:
                if m in self.visits[i]:
                    self._enter(i, m)

    def _replica(self, rep: _Replica, delay: float | None):  # type: ignore[no-untyped-def]
        st = self.models[rep.model]
        if delay is not None:
            yield self.env.timeout(delay)
            if rep.state != "pending":  # cancelled while starting
                return
            rep.idle_since = self.env.now
        rep.state = "idle"
        rep.go = self.env.event()
        st.idle.append(rep)
        self._request_dispatch(rep.model)
        while True:
            batch = yield rep.go
            yield self.env.timeout(rep.service)
            rep.idle_since = self.env.now
            for i in batch:
                self._finished(i, rep.model)
            if rep.state == "retiring":
                rep.state = "gone"
                return
            rep.state = "idle"
            rep.go = self.env.event()
            st.idle.append(rep)
            self._request_dispatch(rep.model)

    def _finished(self, i: int, m: str) -> None:
        if self.more.get((i, m), 0) > 0:  # the next call of the visit enters m's queue
            self.more[(i, m)] -= 1
            self._enter(i, m)
            return
        now = self.env.now
        self.finish[i] = max(self.finish[i], now)
        self.left[i] -= 1
        for c in self.p.children[m]:
            if c not in self.visits[i]:
                continue
            key = (i, c)
            if key not in self.waiting:
                self.waiting[key] = sum(1 for p in self.p.parents[c] if p in self.visits[i])
            self.waiting[key] -= 1
            if self.waiting[key] == 0:
                del self.waiting[key]
                self._enter(i, c)

    def _scaler(self):  # type: ignore[no-untyped-def]
        for t, m, n in self.schedule:
            if self.env.now < t:
                yield self._at(float(t), 0)  # URGENT: before the other events of that instant
            self._scale(m, int(n))

    def _scale(self, m: str, n: int) -> None:
        st = self.models[m]
        live = [r for r in st.replicas if r.state in ("pending", "idle", "busy")]
        if n > len(live):
            for _ in range(n - len(live)):
                rep = _Replica(m)
                st.replicas.append(rep)
                self.env.process(self._replica(rep, self.opt.activation_delay_s))
            return
        k = len(live) - n
        for rep in reversed([r for r in st.replicas if r.state == "pending"]):
            if k == 0:
                break
            rep.state = "gone"
            k -= 1
        while k > 0 and st.idle:
            st.idle.pop().state = "gone"
            k -= 1
        for rep in sorted(
            (r for r in st.replicas if r.state == "busy"), key=lambda r: r.busy_until
        ):
            if k == 0:
                break
            rep.state = "retiring"
            k -= 1

    def run(self) -> np.ndarray:
        """Simulate; return per-query latencies (inf for a query that never finished)."""
        for m in self.p.models:
            for _ in range(self.cfg[m].replicas):
                rep = _Replica(m, state="idle")
                self.models[m].replicas.append(rep)
                self.env.process(self._replica(rep, None))
        self.env.process(self._source())
        if self.schedule:
            self.env.process(self._scaler())
        self.env.run()
        lat = self.finish - self.arr
        lat[np.array(self.left) > 0] = np.inf
        return lat


# -- cases -------------------------------------------------------------------------------------
def _lin(alpha: float, beta: float, hw: str = "gpu-k80", top: int = 32) -> dict[str, dict]:
    bs = [1 << k for k in range(top.bit_length()) if (1 << k) <= top]
    return {hw: {b: round(alpha + beta * b, 9) for b in bs}}


def linear4() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
    """Preprocess (CPU, no batching gain) then three GPU models; about 70-85% utilized at 100 q/s."""
    p = Pipeline.linear("linear4", ["pre", "resnet", "inception", "logreg"])
    prof = Profiles.from_latencies(
        {
            "pre": _lin(0.0, 0.012, "cpu", 16),
            "resnet": _lin(0.020, 0.0025, top=32),
            "inception": _lin(0.015, 0.0030, top=32),
            "logreg": _lin(0.002, 0.0004, "cpu", 16),
        }
    )
    cfg = {
        "pre": ModelConfig("cpu", 1, 2),
        "resnet": ModelConfig("gpu-k80", 8, 1),
        "inception": ModelConfig("gpu-k80", 8, 1),
        "logreg": ModelConfig("cpu", 4, 1),
    }
    return p, prof, cfg


def video() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
    """Fan-out with conditional branches and a join (video monitoring shaped)."""
    p = Pipeline(
        "video",
        ("yolo", "vehicle", "person", "alpr", "report"),
        (
            ("yolo", "vehicle"),
            ("yolo", "person"),
            ("vehicle", "alpr"),
            ("alpr", "report"),
            ("person", "report"),
            ("yolo", "report"),
        ),
        {"vehicle": 0.6, "person": 0.5, "alpr": 0.3},
    )
    prof = Profiles.from_latencies(
        {
            "yolo": _lin(0.010, 0.004, top=32),
            "vehicle": _lin(0.008, 0.003, top=32),
            "person": _lin(0.008, 0.003, top=32),
            "alpr": _lin(0.0, 0.020, "cpu", 16),
            "report": _lin(0.001, 0.0005, "cpu", 16),
        }
    )
    cfg = {
        "yolo": ModelConfig("gpu-k80", 16, 1),
        "vehicle": ModelConfig("gpu-k80", 8, 1),
        "person": ModelConfig("gpu-k80", 8, 1),
        "alpr": ModelConfig("cpu", 1, 1),
        "report": ModelConfig("cpu", 8, 1),
    }
    return p, prof, cfg


_GRID = 1024.0  # 2^-10 s grid: sums stay exact, so events of different origins coincide


def _on_grid(build: Callable[[], tuple[Pipeline, Profiles, dict[str, ModelConfig]]]):  # type: ignore[no-untyped-def]
    """The same case with every latency on a 2^-10 s grid (exercises the same-instant rule)."""

    def grid() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
        p, prof, cfg = build()
        q = {
            m: {
                h: {b: max(1.0, round(bp.latency_s * _GRID)) / _GRID for b, bp in bs.items()}
                for h, bs in hws.items()
            }
            for m, hws in prof.models.items()
        }
        return p, Profiles.from_latencies(q), cfg

    return grid


def _with_wake(build: Callable[[], tuple[Pipeline, Profiles, dict[str, ModelConfig]]]):  # type: ignore[no-untyped-def]
    """The same case with a wake-up extra on every model (+1 ms after 5 ms idle, +4 ms after
    50 ms or more)."""

    def wake() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
        p, prof, cfg = build()
        w = WakeProfile((0.005, 0.05), (0.001, 0.004))
        return p, Profiles(prof.models, {m: {cfg[m].hardware: w} for m in p.models}), cfg

    return wake


def _with_spread(build: Callable[[], tuple[Pipeline, Profiles, dict[str, ModelConfig]]]):  # type: ignore[no-untyped-def]
    """The same case with a service spread on every batch size: p50 0.8x and p99 1.6x the
    profiled latency."""

    def spread() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
        p, prof, cfg = build()
        models = {
            m: {
                h: {
                    b: BatchProfile(
                        bp.latency_s, p50_s=0.8 * bp.latency_s, p99_s=1.6 * bp.latency_s
                    )
                    for b, bp in bs.items()
                }
                for h, bs in hws.items()
            }
            for m, hws in prof.models.items()
        }
        return p, Profiles(models, prof.wake_up), cfg

    return spread


def _with_visits(build: Callable[[], tuple[Pipeline, Profiles, dict[str, ModelConfig]]]):  # type: ignore[no-untyped-def]
    """The same case with repeated calls: every query that visits ``vehicle`` calls it twice,
    one that visits ``alpr`` once or twice (``visits`` 1.5), ``report`` three times."""

    def visits() -> tuple[Pipeline, Profiles, dict[str, ModelConfig]]:
        p, prof, cfg = build()
        p = Pipeline(
            p.name, p.models, p.edges, p.scale_factors, {"vehicle": 2, "alpr": 1.5, "report": 3}
        )
        return p, prof, cfg

    return visits


@dataclass(frozen=True)
class Case:
    name: str
    build: object
    rate: float
    cv: float
    options: EstimatorOptions = field(default_factory=EstimatorOptions)
    schedule: tuple[tuple[float, str, int], ...] = ()
    grid: bool = False  # arrivals rounded to the 2^-10 s grid too


CASES = (
    Case("linear4 b<=8", linear4, 100.0, 1.0),
    Case("linear4 cv4", linear4, 100.0, 4.0),
    Case("linear4 on grid", _on_grid(linear4), 100.0, 2.0, grid=True),
    Case("video fan-out/join", video, 30.0, 1.0, EstimatorOptions(seed=3)),
    Case("video on grid", _on_grid(video), 30.0, 2.0, EstimatorOptions(seed=4), grid=True),
    Case(
        "video hop+wait+sched",
        video,
        30.0,
        2.0,
        EstimatorOptions(
            hop_overhead_s=0.001,
            batch_wait_s={"yolo": 0.005, "report": 0.002},
            activation_delay_s=0.5,
            seed=5,
        ),
        ((20.0, "yolo", 2), (40.0, "alpr", 3), (60.0, "yolo", 1), (80.0, "alpr", 1)),
    ),
    Case("video repeated calls", _with_visits(video), 20.0, 2.0, EstimatorOptions(seed=8)),
    Case(
        "video repeats+wait+hop",
        _with_visits(_on_grid(video)),
        20.0,
        2.0,
        EstimatorOptions(
            hop_overhead_s=1 / 1024, batch_wait_s={"vehicle": 4 / 1024, "alpr": 2 / 1024}, seed=9
        ),
        grid=True,
    ),
    Case(
        "video wake-up+sched",
        _with_wake(video),
        30.0,
        2.0,
        EstimatorOptions(activation_delay_s=0.5, seed=6),
        ((20.0, "yolo", 2), (40.0, "alpr", 3), (60.0, "yolo", 1), (80.0, "alpr", 1)),
    ),
    Case(
        "video spread+wake+sched",
        _with_spread(_with_wake(video)),
        30.0,
        2.0,
        EstimatorOptions(activation_delay_s=0.5, seed=7, service_spread=True),
        ((20.0, "yolo", 2), (40.0, "alpr", 3), (60.0, "yolo", 1), (80.0, "alpr", 1)),
    ),
)


def compare(case: Case, duration_s: float, seed: int = 0) -> dict[str, float]:
    """Run one case through both; return timings and the largest latency difference."""
    pipe, prof, cfg = case.build()  # type: ignore[operator]
    arr = gamma_trace(case.rate, case.cv, duration_s, np.random.default_rng(seed))
    if case.grid:
        arr = np.round(arr * _GRID) / _GRID
    # CPU time of this process: the machine is shared, so wall time mostly measures neighbours
    t = time.process_time()
    ref = SimpyReference(pipe, cfg, prof, arr, options=case.options, schedule=case.schedule).run()
    t_simpy = time.process_time() - t
    simulate(pipe, cfg, prof, arr, options=case.options, schedule=case.schedule)  # warm
    best = math.inf
    for _ in range(3):
        t = time.process_time()
        res = simulate(pipe, cfg, prof, arr, options=case.options, schedule=case.schedule)
        best = min(best, time.process_time() - t)
    a, b = res.latencies_s, ref
    same_inf = bool(np.array_equal(np.isinf(a), np.isinf(b)))
    fin = np.isfinite(a) & np.isfinite(b)
    diff = float(np.max(np.abs(a[fin] - b[fin]))) if fin.any() else 0.0
    return {
        "queries": float(arr.size),
        "visits": float(sum(s.visits for s in res.models.values())),
        "simpy_s": t_simpy,
        "estimator_s": best,
        "ratio": t_simpy / best,
        "max_abs_diff_s": diff if same_inf else math.inf,
        "p99_s": res.percentile(99),
    }


def _compile_time() -> tuple[float, float]:
    """(fresh compile, load from cache) of the kernel, each measured in a new interpreter."""
    code = (
        "import time,numpy as np;t=time.process_time();"
        "from inferline.core import simulate,Pipeline,Profiles,ModelConfig;"
        "p=Pipeline.linear('x',['a']);pr=Profiles.from_latencies({'a':{'cpu':{1:0.01}}});"
        "t1=time.process_time();simulate(p,{'a':ModelConfig('cpu')},pr,np.arange(3.0));"
        "t2=time.process_time();simulate(p,{'a':ModelConfig('cpu')},pr,np.arange(3.0));"
        "t3=time.process_time();print((t2-t1)-(t3-t2))"
    )
    import tempfile

    out = []
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "NUMBA_CACHE_DIR": d}
        for _ in range(2):  # first: empty cache (compile and write); second: load
            r = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            out.append(float(r.stdout.strip().splitlines()[-1]))
    return out[0], out[1]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small traces (about 10 s in all)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="5 s traces, a 60 s big case, the JIT compile time not measured (a few seconds)",
    )
    ap.add_argument("--duration-s", type=float, default=None, help="SimPy comparison trace length")
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of the arrival traces (default %(default)s)"
    )
    args = ap.parse_args(argv)
    dur = args.duration_s or (5.0 if args.smoke else 30.0 if args.quick else 300.0)
    big_s = 60.0 if args.smoke else 600.0 if args.quick else 3600.0

    print(f"SimPy reference vs estimator, {dur:g} s traces (seed {args.seed}); CPU seconds")
    hdr = f"{'case':<22} {'queries':>8} {'visits':>8} {'simpy s':>9} {'est. s':>8} {'ratio':>7} {'max |diff| s':>13}"
    print(hdr)
    print("-" * len(hdr))
    ok = True
    for c in CASES:
        r = compare(c, dur, args.seed)
        ok &= r["max_abs_diff_s"] <= 1e-9
        print(
            f"{c.name:<22} {int(r['queries']):>8} {int(r['visits']):>8} {r['simpy_s']:>9.3f} "
            f"{r['estimator_s']:>8.4f} {r['ratio']:>6.0f}x {r['max_abs_diff_s']:>13.2e}"
        )
    print(f"all latencies agree to 1e-9 s: {'yes' if ok else 'NO'}")

    pipe, prof, cfg = linear4()
    arr = gamma_trace(100.0, 1.0, big_s, np.random.default_rng(args.seed))
    simulate(pipe, cfg, prof, arr[:1000])
    times, cpu = [], []
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        res = simulate(pipe, cfg, prof, arr)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    visits = sum(s.visits for s in res.models.values())
    compile_s, load_s = (float("nan"), float("nan")) if args.smoke else _compile_time()
    print()
    print(f"{'big case':<34} {'value':>12}")
    print(f"{f'linear4, {big_s:g} s at 100 q/s: queries':<34} {arr.size:>12}")
    print(f"{'model visits':<34} {visits:>12}")
    print(f"{'warm wall time, best of 3 (s)':<34} {min(times):>12.3f}")
    print(f"{'warm wall time, median of 3 (s)':<34} {sorted(times)[1]:>12.3f}")
    print(f"{'warm CPU time, best of 3 (s)':<34} {min(cpu):>12.3f}")
    print(f"{'visits per CPU second (M)':<34} {visits / min(cpu) / 1e6:>12.2f}")
    print(f"{'one-off JIT compile, CPU (s)':<34} {compile_s:>12.2f}")
    print(f"{'load from numba cache, CPU (s)':<34} {load_s:>12.2f}")
    print(f"{'P99 latency (s)':<34} {res.percentile(99):>12.4f}")
    print()
    print(
        "reproduce: .venv/bin/python benchmarks/estimator.py"
        + (" --smoke" if args.smoke else " --quick" if args.quick else "")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

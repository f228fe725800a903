"""The profiler (InferLine §4.1): batch latency of every model, per hardware and batch size.

For each model and each hardware kind the backend offers, it deploys one replica, then for
batch sizes 1, 2, 4, ... up to a limit sends batches built from the model's sample inputs
(what the model saw when the sample queries ran through the pipeline), discards a warm-up,
and samples until the P99 is stable. Optionally it runs extra replicas of the same model on
the remaining cores with the same batches at the same time, so the profile reflects a fully
loaded machine (the InferLine paper profiles under this contention rather than on an idle
machine). On a backend of several machines (one with ``nodes()`` whose handles say their
``node``, as ``ray://``), "the machine" is the measured replica's node: as many contending
replicas as fit in that node's free capacity, asked for on that node (``scale(..., node=)``). Latency is timed around ``ReplicaHandle.predict_batch``: the time the interposed
queue sees a replica busy, RPC included, which is what the estimator needs.

Batches sent back to back keep a replica warm; live traffic below saturation reaches replicas
that have been idle, and those run the next batch slower. So for each pair the profiler also
times batches of 1 after idle gaps (``wake_idle_s``) against batches of 1 back to back, and
records the difference as the pair's ``WakeProfile`` (the estimator adds it to a batch that
starts on an idle replica).

The result is a ``Profiles`` (with p50/p99/std/samples extras) and a quantile-regression fit
of latency on batch size per model and hardware (``_profile_fit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core import (
    InferlineError,
    ModelConfig,
    ModelSpec,
    Profiles,
    ValidationError,
    WakeProfile,
)
from inferline.measure._profile_fit import (
    STATISTICS,
    BatchFit,
    batch_profile,
    fit_batch_latency,
    profiles_from_samples,
)

__all__ = ["ProfileResult", "ProfilerOptions", "batch_sizes_up_to", "profile_models"]

log = logging.getLogger(__name__)

# progress(model, hardware, batch_size, points_done, points_total)
Progress = Callable[[str, str, int, int, int], None]


@dataclass(frozen=True)
class ProfilerOptions:
    """How to profile. ``max_batch_size``: largest power of two tried; larger sizes are
    skipped once a batch takes more than ``max_latency_s``. Each point takes ``warmup``
    unmeasured batches, then at least ``min_samples`` and at most ``max_samples`` batches (or
    ``max_seconds_per_point``), stopping early once the P99 moves less than ``p99_tolerance``
    (relative) between rounds of ``min_samples``. ``statistic`` picks the number that becomes
    ``latency_s``. ``contention``: run extra replicas on the free cores at the same time.
    ``wake_idle_s``: idle gaps after which ``wake_samples`` batches of 1 are timed (each after
    its gap, with no contention) against as many back to back; ``()`` skips this.
    """

    max_batch_size: int = 32
    warmup: int = 5
    min_samples: int = 50
    max_samples: int = 400
    max_seconds_per_point: float = 4.0
    p99_tolerance: float = 0.05
    max_latency_s: float = 1.0
    statistic: str = "mean"
    contention: bool = False
    contention_replicas: int | None = None
    hardware: tuple[str, ...] | None = None
    wake_idle_s: tuple[float, ...] = (0.005, 0.02, 0.1)
    wake_samples: int = 20

    def __post_init__(self) -> None:
        gaps = tuple(self.wake_idle_s)
        if any(not isinstance(g, int | float) or isinstance(g, bool) or g <= 0 for g in gaps) or (
            list(gaps) != sorted(set(gaps))
        ):
            raise ValidationError("wake_idle_s", "increasing idle times > 0 seconds", gaps)
        object.__setattr__(self, "wake_idle_s", tuple(float(g) for g in gaps))
        if gaps and self.wake_samples < 3:
            raise ValidationError("wake_samples", "an integer >= 3", self.wake_samples)
        if self.max_batch_size < 1:
            raise ValidationError("max_batch_size", "an integer >= 1", self.max_batch_size)
        if self.min_samples < 2 or self.max_samples < self.min_samples:
            raise ValidationError(
                "min_samples/max_samples",
                "2 <= min_samples <= max_samples",
                (self.min_samples, self.max_samples),
            )
        if self.statistic not in STATISTICS:
            raise ValidationError("statistic", f"one of {list(STATISTICS)!r}", self.statistic)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["hardware"] = None if self.hardware is None else list(self.hardware)
        d["wake_idle_s"] = list(self.wake_idle_s)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfilerOptions:
        kw = dict(d)
        if kw.get("hardware") is not None:
            kw["hardware"] = tuple(kw["hardware"])
        if "wake_idle_s" in kw:
            kw["wake_idle_s"] = tuple(kw["wake_idle_s"])
        unknown = set(kw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValidationError("profiler options", "known option names", sorted(unknown))
        return cls(**kw)


@dataclass(frozen=True)
class ProfileResult:
    """Profiles plus the fits and the raw samples they came from."""

    profiles: Profiles
    fits: tuple[BatchFit, ...]
    samples: Mapping[str, Mapping[str, Mapping[int, tuple[float, ...]]]] = field(
        default_factory=dict
    )
    seconds: float = 0.0
    # model -> hardware -> batch size -> batches the contending replicas answered while that
    # point was measured (empty with contention off)
    contention: Mapping[str, Mapping[str, Mapping[int, int]]] = field(default_factory=dict)

    def fit(self, model: str, hardware: str, quantile: float = 0.5) -> BatchFit:
        for f in self.fits:
            if f.model == model and f.hardware == hardware and f.quantile == quantile:
                return f
        raise ValidationError("fit", f"a fitted (model, hardware, q={quantile})", (model, hardware))

    def to_dict(self) -> dict[str, Any]:
        return {
            "profiles": self.profiles.to_dict(),
            "fits": [f.to_dict() for f in self.fits],
            "seconds": self.seconds,
            "contention_batches": {
                m: {hw: {str(b): n for b, n in by_b.items()} for hw, by_b in by_hw.items()}
                for m, by_hw in self.contention.items()
            },
        }


def batch_sizes_up_to(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (``limit`` itself included when not a power of two)."""
    out = []
    b = 1
    while b <= limit:
        out.append(b)
        b *= 2
    if out[-1] != limit:
        out.append(limit)
    return out


def _batch(inputs: Sequence[Any], size: int, offset: int) -> list[Any]:
    n = len(inputs)
    return [inputs[(offset + j) % n] for j in range(size)]


async def _sample_point(
    handle: Any, inputs: Sequence[Any], size: int, opts: ProfilerOptions
) -> list[float]:
    """Latencies of batches of ``size`` on ``handle`` until the P99 is stable."""
    clock = time.perf_counter
    offset = 0
    for _ in range(opts.warmup):
        await handle.predict_batch(_batch(inputs, size, offset))
        offset += size
    lat: list[float] = []
    start = clock()
    last_p99 = None
    while len(lat) < opts.max_samples:
        batch = _batch(inputs, size, offset)
        offset += size
        t0 = clock()
        out = await handle.predict_batch(batch)
        lat.append(clock() - t0)
        if len(out) != size:
            raise ValidationError(
                f"outputs of {handle.model!r}", f"{size} outputs for {size} inputs", len(out)
            )
        if len(lat) % opts.min_samples == 0:
            p99 = float(np.percentile(lat, 99))
            if last_p99 is not None and abs(p99 - last_p99) <= opts.p99_tolerance * last_p99:
                break
            last_p99 = p99
        if clock() - start > opts.max_seconds_per_point and len(lat) >= opts.min_samples:
            break
    return lat


class _Contention:
    """The contending replicas kept busy with the same batches while one point is measured.

    Entered, it starts a loop per replica and returns once each has answered a batch, so the
    first measured batch (warm-up included) already shares the machine; a replica that was
    still starting would otherwise leave the first samples uncontended. ``batches`` counts
    what the contenders answered while the point was measured (the profile records it)."""

    START_TIMEOUT_S = 60.0

    def __init__(self, handles: Sequence[Any], inputs: Sequence[Any], size: int) -> None:
        self._handles = list(handles)
        self._inputs = inputs
        self._size = size
        self._answered = [asyncio.Event() for _ in self._handles]
        self._task: asyncio.Future[Any] | None = None
        self.batches = 0

    async def _loop(self, k: int) -> None:
        h, offset = self._handles[k], k * 7919
        while True:
            try:
                await h.predict_batch(_batch(self._inputs, self._size, offset))
            except InferlineError:
                await asyncio.sleep(0.01)
            else:
                self.batches += 1
                self._answered[k].set()
            offset += self._size

    async def __aenter__(self) -> _Contention:
        if not self._handles:
            return self
        self._task = asyncio.gather(*(self._loop(k) for k in range(len(self._handles))))
        waits = asyncio.gather(*(e.wait() for e in self._answered))
        try:
            await asyncio.wait_for(waits, self.START_TIMEOUT_S)
        except TimeoutError:
            await self.__aexit__()
            started = sum(e.is_set() for e in self._answered)
            raise InferlineError(
                f"contending replicas: {started} of {len(self._handles)} answered a batch "
                f"within {self.START_TIMEOUT_S:g} s; profile with contention off "
                "(--no-contention) or find why they do not serve"
            ) from None
        self.batches = 0  # count only what overlapped the measurement
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, InferlineError):
                await self._task
            self._task = None


async def profile_models(
    backend: Any,
    specs: Sequence[ModelSpec],
    inputs: Mapping[str, Sequence[Any]],
    options: ProfilerOptions | None = None,
    *,
    progress: Progress | None = None,
) -> ProfileResult:
    """Profile every model of ``specs`` on every hardware kind of ``backend.inventory()``
    (or ``options.hardware``), using ``inputs[model]`` as the queries of its batches."""
    options = options or ProfilerOptions()
    t_start = time.perf_counter()
    inv = backend.inventory()
    have = [h for h, n in inv.items() if n > 0]
    # a kind asked for that the backend lacks was dropped silently (only none left was refused)
    unknown = [h for h in options.hardware or () if h not in have]
    if unknown or not have:
        raise ValidationError("hardware", f"kinds the backend has, among {have}", unknown or inv)
    hardware = list(dict.fromkeys(options.hardware or have))
    for s in specs:
        if not inputs.get(s.name):
            raise ValidationError(f"inputs.{s.name}", "at least one sample input", None)
    sizes = batch_sizes_up_to(options.max_batch_size)
    total = len(specs) * len(hardware) * len(sizes)
    done = 0
    samples: dict[str, dict[str, dict[int, tuple[float, ...]]]] = {}
    wake: dict[str, dict[str, WakeProfile]] = {}
    contention: dict[str, dict[str, dict[int, int]]] = {}
    for spec in specs:
        for hw in hardware:
            per_b, bg, w = await _profile_pair(
                backend, spec, hw, inputs[spec.name], sizes, options, done, total, progress
            )
            done += len(sizes)
            if per_b:
                samples.setdefault(spec.name, {})[hw] = per_b
            if bg:
                contention.setdefault(spec.name, {})[hw] = bg
            if per_b and w is not None:
                wake.setdefault(spec.name, {})[hw] = w
            if progress is not None:
                progress(spec.name, hw, sizes[-1], done, total)
    profiles = profiles_from_samples(samples, options.statistic)
    profiles = Profiles(profiles.models, wake)
    fits = []
    for m, by_hw in samples.items():
        for hw, by_b in by_hw.items():
            for q in (0.5, 0.99):
                fits.append(fit_batch_latency(m, hw, by_b, q))
    took = time.perf_counter() - t_start
    return ProfileResult(profiles, tuple(fits), samples, took, contention)


async def _profile_pair(
    backend: Any,
    spec: ModelSpec,
    hw: str,
    inputs: Sequence[Any],
    sizes: Sequence[int],
    opts: ProfilerOptions,
    done: int,
    total: int,
    progress: Progress | None,
) -> tuple[dict[int, tuple[float, ...]], dict[int, int], WakeProfile | None]:
    out: dict[int, tuple[float, ...]] = {}
    contended: dict[int, int] = {}
    wake = None
    await backend.deploy(spec, ModelConfig(hw, max(sizes), 1))
    try:
        handles = list(backend.replicas(spec.name))
        if not handles:
            raise ValidationError(f"replicas of {spec.name!r}", "one active replica", [])
        target = handles[0]
        others: list[Any] = []
        if opts.contention:
            node = _node_of(backend, target)
            extra = opts.contention_replicas
            if extra is None:
                if node is not None:
                    extra = _fit_on(node.free, hw, spec.threads)
                else:
                    extra = backend.free().get(hw, 0) // (spec.threads if hw == "cpu" else 1)
            if extra > 0:
                if node is not None:  # on the measured replica's machine, not spread out
                    await backend.scale(spec.name, 1 + extra, node=node.node_id)
                else:
                    await backend.scale(spec.name, 1 + extra)
                others = [h for h in backend.replicas(spec.name) if h.id != target.id]
                log.info(
                    "profiling %s on %s with %d contending replicas%s",
                    spec.name,
                    hw,
                    len(others),
                    "" if node is None else f" on its node {node.node_id[:8]}",
                )
        for i, b in enumerate(sizes):
            if progress is not None:
                progress(spec.name, hw, b, done + i, total)
            async with _Contention(others, inputs, b) as bg:
                lat = await _sample_point(target, inputs, b, opts)
            if others:
                contended[b] = bg.batches
            out[b] = tuple(lat)
            if float(np.median(lat)) > opts.max_latency_s:
                log.info(
                    "%s on %s: batch %d takes %.3f s > %.3f s; not profiling larger batches",
                    spec.name,
                    hw,
                    b,
                    float(np.median(lat)),
                    opts.max_latency_s,
                )
                break
        if opts.wake_idle_s:  # the contending replicas are idle again by now
            wake = await _wake_probe(target, inputs, opts)
            log.info("%s on %s: wake-up extras %s", spec.name, hw, wake)
    finally:
        await backend.remove(spec.name)
    return out, contended, wake


def _node_of(backend: Any, handle: Any) -> Any:
    """The ``NodeInfo`` of the node ``handle`` runs on, for a backend of several machines
    (one with ``nodes()``, whose handles say their ``node``); None elsewhere."""
    nodes = getattr(backend, "nodes", None)
    where = getattr(handle, "node", None)
    if not callable(nodes) or not where:
        return None
    return next((n for n in nodes() if n.node_id == where and n.alive), None)


def _fit_on(free: Mapping[str, int], hw: str, threads: int) -> int:
    """How many more replicas of ``threads`` threads on ``hw`` fit in one node's ``free``: CPUs
    for every kind (each replica holds ``threads``), and one unit of a kind other than cpu."""
    by_cpu = free.get("cpu", 0) // max(1, threads)
    return by_cpu if hw == "cpu" else min(by_cpu, free.get(hw, 0))


async def _wake_probe(handle: Any, inputs: Sequence[Any], opts: ProfilerOptions) -> WakeProfile:
    """Batches of 1 back to back, then after each idle gap: the extra the gap costs."""
    clock = time.perf_counter

    async def timed(k: int, gap: float) -> float:
        if gap > 0:
            await asyncio.sleep(gap)
        t0 = clock()
        await handle.predict_batch(_batch(inputs, 1, k))
        return clock() - t0

    for k in range(opts.warmup):
        await timed(k, 0.0)
    n = opts.wake_samples
    stat = {}
    for gap in (0.0, *opts.wake_idle_s):
        lat = [await timed(k, gap) for k in range(n)]
        stat[gap] = batch_profile(lat, opts.statistic).latency_s
    back = stat.pop(0.0)
    return WakeProfile.from_samples(back, stat)

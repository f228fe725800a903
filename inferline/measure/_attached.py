"""Profiling the models of an attached server (``inferline attach``) on the replicas they already have, through the live server."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from inferline.core import (
    ModelConfig,
    Profiles,
    ValidationError,
    WakeProfile,
)
from inferline.measure._profiler import (
    ProfileResult,
    ProfilerOptions,
    Progress,
    _batch,
    batch_sizes_up_to,
)
from inferline.server.frontdoors import Signature, TensorInfo

__all__ = ["profile_attachment", "synthetic_inputs"]

# A point of the attached profile is done once its mean (the ``latency_s`` the planner
# uses) is known within this relative standard error: a P99 stable to 5% takes hundreds of
# batches, the mean a few dozen (most of ``attach --steer``'s time went to the former).
_MEAN_RSE = 0.03
_MIN_POINT_SAMPLES = 10
# idle-gap batches per gap of the wake probe (its extras are means of ms-scale figures)
_WAKE_SAMPLES = 6


class AttachmentLike(Protocol):
    """What ``profile_attachment`` reads of an attachment (``inferline.deploy.Attachment``;
    measure sits below deploy, so it names the shape, not the class)."""

    @property
    def models(self) -> Mapping[str, ModelConfig]: ...
    @property
    def signatures(self) -> Mapping[str, Signature]: ...


def synthetic_inputs(sig: Signature, n: int, seed: int = 0) -> list[Any]:
    """``n`` random queries shaped like ``sig``'s inputs (for profiling latency when no
    real samples are given; -1 dims become 8)."""
    rng = np.random.default_rng(seed)

    def one(t: TensorInfo) -> Any:
        shape = tuple(8 if s < 0 else s for s in t.shape)
        if t.dtype == "object":
            return np.array([b"x" * 8] * int(np.prod(shape)), dtype=object).reshape(shape)
        dt = np.dtype(t.dtype)
        if dt.kind == "f":
            return rng.random(shape).astype(dt)
        if dt.kind == "b":
            return rng.random(shape) < 0.5
        return rng.integers(0, 10, shape).astype(dt)

    out = []
    for _ in range(n):
        if len(sig.inputs) == 1:
            out.append(one(sig.inputs[0]))
        else:
            out.append({t.name: one(t) for t in sig.inputs})
    return out


def mean_settled(lat: Sequence[float], rse: float = _MEAN_RSE) -> bool:
    """Whether the mean of ``lat`` is known within ``rse`` (relative standard error)."""
    n = len(lat)
    if n < _MIN_POINT_SAMPLES:
        return False
    mean = float(np.mean(lat))
    return mean > 0 and float(np.std(lat, ddof=1)) / np.sqrt(n) <= rse * mean


async def _sample_mean_point(
    handle: Any, inputs: Sequence[Any], size: int, opts: ProfilerOptions
) -> list[float]:
    """Latencies of batches of ``size`` on ``handle`` until their mean settles
    (``mean_settled``), ``opts.max_samples`` or ``opts.max_seconds_per_point``."""
    clock = time.perf_counter
    offset = 0
    for _ in range(min(opts.warmup, 2)):  # the server is warm: it serves this model already
        await handle.predict_batch(_batch(inputs, size, offset))
        offset += size
    lat: list[float] = []
    start = clock()
    while len(lat) < opts.max_samples and not mean_settled(lat):
        t0 = clock()
        out = await handle.predict_batch(_batch(inputs, size, offset))
        lat.append(clock() - t0)
        offset += size
        if len(out) != size:
            raise ValidationError(
                f"outputs of {handle.model!r}", f"{size} outputs for {size} inputs", len(out)
            )
        if clock() - start > opts.max_seconds_per_point and len(lat) >= 2:
            break
    return lat


async def profile_attachment(
    att: AttachmentLike,
    inputs: Mapping[str, Sequence[Any]] | None = None,
    options: ProfilerOptions | None = None,
    *,
    samples: int = 32,
    seed: int = 0,
    progress: Progress | None = None,
) -> ProfileResult:
    """Profile every adopted model on the replicas it already has (no redeploy): batches of
    1, 2, 4, ... up to ``options.max_batch_size`` through the live server, timed around
    ``predict_batch`` as the queue sees it, each until its mean settles (``mean_settled``);
    the wake probe takes at most ``_WAKE_SAMPLES`` batches per idle gap. ``inputs[model]`` are the queries (default:
    ``synthetic_inputs`` from the model's signature)."""
    from inferline.measure._profile_fit import fit_batch_latency, profiles_from_samples
    from inferline.measure._profiler import _wake_probe

    opts = options or ProfilerOptions(max_batch_size=16)
    wake_opts = replace(opts, wake_samples=min(opts.wake_samples, _WAKE_SAMPLES))
    t0 = time.perf_counter()
    sizes = batch_sizes_up_to(opts.max_batch_size)
    total = len(att.models) * len(sizes)
    done = 0
    raw: dict[str, dict[str, dict[int, tuple[float, ...]]]] = {}
    wake: dict[str, dict[str, WakeProfile]] = {}
    for name, cfg in att.models.items():
        xs = list((inputs or {}).get(name) or [])
        if not xs:
            if name not in att.signatures:
                raise ValidationError(
                    f"inputs.{name}", "sample inputs (the server gave no signature)", None
                )
            xs = synthetic_inputs(att.signatures[name], samples, seed)
        handles = att.backend.replicas(name)
        if not handles:
            raise ValidationError(f"replicas of {name!r}", "at least one active replica", [])
        per_b: dict[int, tuple[float, ...]] = {}
        for b in sizes:
            if progress is not None:
                progress(name, cfg.hardware, b, done, total)
            lat = await _sample_mean_point(handles[0], xs, b, opts)
            per_b[b] = tuple(lat)
            done += 1
            if float(np.median(lat)) > opts.max_latency_s:
                break
        raw[name] = {cfg.hardware: per_b}
        if opts.wake_idle_s:
            wake[name] = {cfg.hardware: await _wake_probe(handles[0], xs, wake_opts)}
    profiles = profiles_from_samples(raw, opts.statistic)
    profiles = Profiles(profiles.models, wake)
    fits = tuple(
        fit_batch_latency(m, hw, by_b, q)
        for m, by_hw in raw.items()
        for hw, by_b in by_hw.items()
        for q in (0.5, 0.99)
    )
    return ProfileResult(profiles, fits, raw, time.perf_counter() - t0)

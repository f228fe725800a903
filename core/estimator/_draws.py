"""The estimator's random draws, made up front from the seed and cached: which models each
query visits (the conditional control flow) and the service spread's clipped normals; the
spread's log-normal and the fastest service it can draw (what a lower bound must assume)."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from statistics import NormalDist

import numpy as np

from .._pipeline import Pipeline
from .._profiles import BatchProfile, Profiles

__all__ = [
    "CACHE_LOCK",
    "SPREAD_Z_CLIP",
    "draw_visits",
    "normals",
    "spread_floor",
    "spread_params",
    "visits",
]


def draw_visits(pipeline: Pipeline, n: int, seed: int) -> np.ndarray:
    """Visit matrix ``[n, M]`` (models in topological order), drawn up front: the number of
    calls each query makes to each model (0: it does not visit it).

    One ``rng.random(n)`` per model in topological order from ``default_rng(seed)``: a query
    visits a root with its scale factor, and any other model iff it visited at least one parent
    and the draw is below ``pipeline.visit_probability(model)``. A visit makes
    ``floor(visits[m])`` calls, one more where a draw from a stream of its own
    (``default_rng([seed, 2])``, one ``random(n)`` per model with a fractional ``visits``, in
    topological order) is below the fractional part; with integer visits nothing is drawn.
    """
    order = pipeline.topological_order
    pos = {m: j for j, m in enumerate(order)}
    rng = np.random.default_rng(seed)
    vis = np.zeros((n, len(order)), dtype=np.uint8)
    for j, m in enumerate(order):
        u = rng.random(n)
        ok = u < pipeline.visit_probability(m)
        ps = pipeline.parents[m]
        if ps:
            anyp = np.zeros(n, dtype=bool)
            for p in ps:
                anyp |= vis[:, pos[p]].astype(bool)
            ok &= anyp
        vis[:, j] = ok
    extra: np.random.Generator | None = None
    for j, m in enumerate(order):
        v = pipeline.visits_of(m)
        if v == 1.0:
            continue
        k = math.floor(v)
        calls = np.full(n, k, dtype=np.uint8)
        if v > k:
            extra = extra if extra is not None else np.random.default_rng([seed, 2])
            calls += (extra.random(n) < v - k).astype(np.uint8)
        vis[:, j] *= calls
    return vis


# Service spread: 200-odd profiling samples say little beyond their 99.9th percentile, and an
# unclipped log-normal fitted to a noisy p99 would now and then draw absurd service times.
_Z99 = NormalDist().inv_cdf(0.99)
SPREAD_Z_CLIP = NormalDist().inv_cdf(0.999)


def spread_params(bp: BatchProfile) -> tuple[float, float] | None:
    """(log median, log-sd) of the log-normal through the batch profile's p50 and p99, or
    None where it has not both or they show no spread."""
    p50, p99 = bp.p50_s, bp.p99_s
    if p50 is None or p99 is None or not 0.0 < p50 < p99:
        return None
    return math.log(p50), math.log(p99 / p50) / _Z99


def spread_floor(profiles: Profiles) -> Profiles:
    """``profiles`` with every ``latency_s`` lowered to the shortest service time the spread
    can draw for it: what a lower bound (the planner's :class:`MissBound`) must assume when the
    estimator draws service times."""
    models = {}
    for m, hws in profiles.models.items():
        models[m] = {}
        for hw, by_b in hws.items():
            models[m][hw] = {}
            for b, bp in by_b.items():
                sp = spread_params(bp)
                if sp is not None:
                    low = math.exp(sp[0] - SPREAD_Z_CLIP * sp[1])
                    bp = replace(bp, latency_s=min(bp.latency_s, low))
                models[m][hw][b] = bp
    return Profiles(models, profiles.wake_up)


# The kernel releases the GIL (the ladder plans its rate factors in threads); the caches'
# evictions are not atomic, so they are mutated under this lock.
CACHE_LOCK = threading.Lock()

_VISITS: dict[tuple[int, int, int], tuple[Pipeline, np.ndarray, np.ndarray, np.ndarray]] = {}


def visits(pipeline: Pipeline, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(calls [n, M], visited parents per visit, visits per query), cached by pipeline identity.

    The planner simulates one trace thousands of times; the draws depend only on these keys.
    Callers must copy the last two before the kernel mutates them.
    """
    key = (id(pipeline), n, seed)
    hit = _VISITS.get(key)
    if hit is not None and hit[0] is pipeline:
        return hit[1], hit[2], hit[3]
    vis = draw_visits(pipeline, n, seed)
    pos = {m: j for j, m in enumerate(pipeline.topological_order)}
    rem = np.zeros(vis.shape, dtype=np.int32)
    for j, m in enumerate(pipeline.topological_order):
        for q in pipeline.parents[m]:
            rem[:, j] += vis[:, pos[q]] > 0
    rem *= vis > 0  # only visited models wait for parents
    left = (vis > 0).sum(axis=1, dtype=np.int32)
    for a in (vis, rem, left):
        a.flags.writeable = False
    with CACHE_LOCK:
        while len(_VISITS) >= 8:
            _VISITS.pop(next(iter(_VISITS)))
        _VISITS[key] = (pipeline, vis, rem, left)
    return vis, rem, left


_NORMALS: dict[tuple[int, int], np.ndarray] = {}


def normals(n: int, seed: int) -> np.ndarray:
    """The service-spread draws: one standard normal per visit (flat ``i * M + m``), clipped,
    from a stream of its own (the visit draws stay what they were)."""
    key = (n, seed)
    hit = _NORMALS.get(key)
    if hit is not None:
        return hit
    z = np.random.default_rng([seed, 1]).standard_normal(n)
    np.clip(z, -SPREAD_Z_CLIP, SPREAD_Z_CLIP, out=z)
    z.flags.writeable = False
    with CACHE_LOCK:
        while len(_NORMALS) >= 4:
            _NORMALS.pop(next(iter(_NORMALS)))
        _NORMALS[key] = z
    return z

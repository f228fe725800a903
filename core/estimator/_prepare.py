"""Preparation of a simulation: the inputs checked and laid out as the kernel's flat arrays.

Models are numbered in topological order. The latency table has one row per stage (its own
profile on its configured hardware) and one more per variant a controller may switch a stage
to; wake-up extras, service-spread parameters and shared-core pools are laid out by table row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._hardware import HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig
from .._profiles import Profiles
from ..errors import ValidationError
from . import _estimator_kernel as K
from ._batchers import TFServingBatcher, TritonBatcher
from ._draws import CACHE_LOCK, spread_params
from ._options import EstimatorOptions

__all__ = ["Prep", "check_arrivals", "prepare"]


def check_arrivals(arrivals: Any) -> np.ndarray:
    a = np.asarray(arrivals, dtype=np.float64)
    if a.ndim != 1:
        raise ValidationError("arrivals", "a 1-D array of arrival times", f"shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValidationError("arrivals", "finite arrival times", "NaN or inf")
    if a.size > 1 and np.any(np.diff(a) < 0):
        i = int(np.argmax(np.diff(a) < 0))
        raise ValidationError(
            "arrivals", "non-decreasing arrival times", f"arrivals[{i + 1}] < arrivals[{i}]"
        )
    return np.ascontiguousarray(a)


@dataclass
class Prep:
    order: tuple[str, ...]
    maxb: np.ndarray  # by table row
    table: np.ndarray  # rows 0..M-1 the stages, then the variants of ``rows``
    wake_g: np.ndarray  # by table row: WakeProfile points (see KState)
    wake_x: np.ndarray
    wake_n: np.ndarray
    spr_mu: np.ndarray  # by table row and batch size: see KState
    spr_sig: np.ndarray
    # shared cores: each table row's group of pools (-1: none) and units; per group its first
    # pool, its number of pools, whether pinned (a pool per core) or one pool; per pool units
    row_group: np.ndarray
    row_units: np.ndarray
    group_first: np.ndarray
    group_size: np.ndarray
    group_pinned: np.ndarray
    pool_cap: np.ndarray
    rows: Mapping[tuple[str, str], int]  # (stage, variant) -> table row
    waitv: np.ndarray
    replicas: np.ndarray
    price: np.ndarray
    ch_ptr: np.ndarray
    ch_idx: np.ndarray
    is_root: np.ndarray
    # the servers' own batchers by model (KState fields of the same names)
    sbk: np.ndarray
    sb_max: np.ndarray
    sb_size: np.ndarray
    sb_wait: np.ndarray
    sb_tmo: np.ndarray
    sb_lim: np.ndarray
    sb_enq: np.ndarray


def prepare(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    options: EstimatorOptions,
    catalog: HardwareCatalog,
    resizable: bool = False,
    variants: Mapping[str, Sequence[str]] | None = None,
) -> Prep:
    order = pipeline.topological_order
    pos = {m: j for j, m in enumerate(order)}
    maxb, replicas, price = _stages(pipeline, configs, profiles, options, catalog)
    # A controller may change batch sizes: tables then go up to the largest profiled batch.
    top = [
        profiles.max_batch(m, configs[m].hardware) if resizable else int(maxb[j])
        for j, m in enumerate(order)
    ]
    rows, row_of = _variant_rows(order, pos, configs, profiles, variants)
    M = len(order)
    B = int(max([*top, *(r[2] for r in row_of)]))
    R = M + len(row_of)
    table = np.zeros((R, B + 1), dtype=np.float64)
    for j, m in enumerate(order):
        hw = configs[m].hardware
        table[j, : top[j] + 1] = _latency_table(profiles, m, hw, int(top[j]))
    rmaxb = np.concatenate([maxb, np.zeros(len(row_of), dtype=np.int64)])
    for k, (v, j, vtop) in enumerate(row_of):
        table[M + k, : vtop + 1] = _latency_table(profiles, v, configs[order[j]].hardware, vtop)
        rmaxb[M + k] = min(int(maxb[j]), vtop)  # until a switch names its batch size
    pairs = [(m, configs[m].hardware) for m in order]
    pairs += [(v, configs[order[j]].hardware) for v, j, _ in row_of]
    wake_g, wake_x, wake_n = _wake(profiles, pairs, options)
    spr_mu = np.zeros((R, B + 1))
    spr_sig = np.zeros((R, B + 1))
    if options.service_spread:
        sizes = [*top, *(r[2] for r in row_of)]
        for r, (m, hw) in enumerate(pairs):
            for b in range(1, int(sizes[r]) + 1):
                sp = spread_params(profiles.batch_profile(m, hw, b))
                if sp is not None:
                    spr_mu[r, b], spr_sig[r, b] = sp
    pools = _pools(pairs, options, catalog)
    # a configuration's own wait (a plan's batch_wait_ms) wins over the option's
    waitv = np.array(
        [configs[m].batch_wait_s or float(options.batch_wait_s.get(m, 0.0)) for m in order]
    )
    for j, m in enumerate(order):
        if m in options.server_batchers:
            waitv[j] = -1.0  # the kernel's mark of a server batcher's FIFO queue
    ch_ptr = np.zeros(M + 1, dtype=np.int64)
    kids: list[int] = []
    for j, m in enumerate(order):
        kids.extend(pos[c] for c in pipeline.children[m])
        ch_ptr[j + 1] = len(kids)
    is_root = np.array([not pipeline.parents[m] for m in order], dtype=np.uint8)
    _check_variant_sizes(order, options, rows, row_of)
    return Prep(
        order,
        rmaxb,
        table,
        wake_g,
        wake_x,
        wake_n,
        spr_mu,
        spr_sig,
        *pools,
        rows,
        waitv,
        replicas,
        price,
        ch_ptr,
        np.array(kids, np.int64),
        is_root,
        *_server_batchers(order, options, B),
    )


def _check_variant_sizes(
    order: tuple[str, ...],
    options: EstimatorOptions,
    rows: Mapping[tuple[str, str], int],
    row_of: Sequence[tuple[str, int, int]],
) -> None:
    """A server-batched stage's variants must be profiled up to the batcher's batch size."""
    M = len(order)
    for (stage, v), r in rows.items():
        b = options.server_batchers.get(stage)
        if b is not None and row_of[r - M][2] < b.max_batch_size:
            raise ValidationError(
                f"variants.{stage}",
                f"models profiled up to the server batcher's max_batch_size {b.max_batch_size}",
                v,
            )


def _server_batchers(
    order: tuple[str, ...], options: EstimatorOptions, B: int
) -> tuple[np.ndarray, ...]:
    """The ``Prep`` fields ``sbk`` to ``sb_enq``; all zero (and ``sb_size`` one column) where
    no model has a server batcher."""
    M = len(order)
    sbk = np.zeros(M, dtype=np.int64)
    sb_max = np.zeros(M, dtype=np.int64)
    sb_size = np.zeros((M, B + 1 if options.server_batchers else 1), dtype=np.int64)
    sb_wait = np.zeros(M)
    sb_tmo = np.zeros(M)
    sb_lim = np.full(M, np.iinfo(np.int64).max, dtype=np.int64)  # Triton: replicas only
    sb_enq = np.zeros(M, dtype=np.int64)
    for j, m in enumerate(order):
        b = options.server_batchers.get(m)
        if b is None:
            continue
        sb_max[j] = b.max_batch_size
        if isinstance(b, TritonBatcher):
            sbk[j] = K.SB_TRITON
            for p in b.preferred:  # increasing: the largest preferred size <= n wins
                sb_size[j, p:] = p
            sb_wait[j] = b.max_queue_delay_microseconds / 1e6
            sb_tmo[j] = b.default_timeout_microseconds / 1e6
        else:
            assert isinstance(b, TFServingBatcher)
            sbk[j] = K.SB_TF
            sb_size[j, : b.max_batch_size + 1] = [b.padded(n) for n in range(b.max_batch_size + 1)]
            sb_wait[j] = b.batch_timeout_micros / 1e6
            sb_lim[j] = b.num_batch_threads
            sb_enq[j] = b.max_enqueued_batches
    return sbk, sb_max, sb_size, sb_wait, sb_tmo, sb_lim, sb_enq


def _stages(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    options: EstimatorOptions,
    catalog: HardwareCatalog,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stage's configuration checked: its max batch size, replicas and price per hour,
    in topological order."""
    order = pipeline.topological_order
    pos = {m: j for j, m in enumerate(order)}
    for k in configs:
        if k not in pos:
            raise ValidationError("configs", f"model names from {list(pipeline.models)!r}", k)
    for name in ("batch_wait_s", "server_batchers"):
        for k in getattr(options, name):
            if k not in pos:
                raise ValidationError(
                    f"options.{name}", f"model names from {list(pipeline.models)!r}", k
                )
    M = len(order)
    maxb = np.zeros(M, dtype=np.int64)
    replicas = np.zeros(M, dtype=np.int64)
    price = np.zeros(M, dtype=np.float64)
    for j, m in enumerate(order):
        c = configs.get(m)
        if not isinstance(c, ModelConfig):
            raise ValidationError(f"configs.{m}", "a ModelConfig", c)
        if c.hardware not in catalog:
            raise ValidationError(
                f"configs.{m}.hardware",
                f"hardware from the catalog {catalog.names()!r}",
                c.hardware,
            )
        if not profiles.has(m, c.hardware):
            have = sorted(profiles.models.get(m, {}))
            raise ValidationError(
                f"configs.{m}.hardware", f"a hardware profiled for {m!r} ({have!r})", c.hardware
            )
        largest = profiles.max_batch(m, c.hardware)
        if c.max_batch_size > largest:
            raise ValidationError(
                f"configs.{m}.max_batch_size",
                f"at most the largest profiled batch size {largest} on {c.hardware!r}",
                c.max_batch_size,
            )
        maxb[j] = _server_max(m, c, options, largest)
        replicas[j] = c.replicas
        price[j] = catalog.cost(c.hardware)
    return maxb, replicas, price


def _server_max(m: str, c: ModelConfig, options: EstimatorOptions, largest: int) -> int:
    """The model's max batch size: its server batcher's if it has one (checked against the
    profile; no batch wait of the estimator's beside it), else the configuration's."""
    b = options.server_batchers.get(m)
    if b is None:
        return c.max_batch_size
    if b.max_batch_size > largest:
        raise ValidationError(
            f"options.server_batchers.{m}.max_batch_size",
            f"at most the largest profiled batch size {largest} on {c.hardware!r}",
            b.max_batch_size,
        )
    if c.batch_wait_ms > 0:
        raise ValidationError(
            f"configs.{m}.batch_wait_ms", "0 for a model with a server batcher", c.batch_wait_ms
        )
    if options.batch_wait_s.get(m, 0.0) > 0:
        raise ValidationError(
            f"options.batch_wait_s.{m}",
            "0 for a model with a server batcher",
            options.batch_wait_s[m],
        )
    return b.max_batch_size


def _variant_rows(
    order: tuple[str, ...],
    pos: Mapping[str, int],
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    variants: Mapping[str, Sequence[str]] | None,
) -> tuple[dict[tuple[str, str], int], list[tuple[str, int, int]]]:
    """The variants a controller may switch stages to, one more table row each:
    ``(stage, variant) -> row`` and, by row, ``(variant, stage index, largest batch)``."""
    M = len(order)
    rows: dict[tuple[str, str], int] = {}
    row_of: list[tuple[str, int, int]] = []  # (variant, stage index, largest batch)
    for stage, names in (variants or {}).items():
        if stage not in pos:
            raise ValidationError("variants", f"stages from {list(order)!r}", stage)
        hw = configs[stage].hardware
        for v in names:
            if not isinstance(v, str) or not profiles.has(v, hw):
                raise ValidationError(
                    f"variants.{stage}", f"models profiled on the stage's hardware {hw!r}", v
                )
            if (stage, v) not in rows:
                rows[(stage, v)] = M + len(row_of)
                row_of.append((v, pos[stage], profiles.max_batch(v, hw)))
    return rows, row_of


def _wake(
    profiles: Profiles, pairs: Sequence[tuple[str, str]], options: EstimatorOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By table row, the wake-up extra's points (idle times, extras, how many)."""
    R = len(pairs)
    wakes = [profiles.wake(m, hw) if options.wake_up else None for m, hw in pairs]
    G = max([len(w.idle_s) for w in wakes if w is not None], default=1)
    wake_g = np.ones((R, G))
    wake_x = np.zeros((R, G))
    wake_n = np.zeros(R, dtype=np.int64)
    for r, w in enumerate(wakes):
        if w is not None and w.extra_s[-1] > 0.0:
            k = len(w.idle_s)
            wake_g[r, :k], wake_x[r, :k], wake_n[r] = w.idle_s, w.extra_s, k
    return wake_g, wake_x, wake_n


def _pools(
    pairs: Sequence[tuple[str, str]], options: EstimatorOptions, catalog: HardwareCatalog
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shared-core pools (``Prep`` fields ``row_group`` to ``pool_cap``)."""
    for name in ("shared_units", "pinned_cores"):
        for hw in getattr(options, name):
            if hw not in catalog:
                raise ValidationError(
                    f"options.{name}", f"hardware from the catalog {catalog.names()!r}", hw
                )
    groups = sorted(
        {hw for _, hw in pairs if hw in options.shared_units or hw in options.pinned_cores}
    )
    row_group = np.array([groups.index(hw) if hw in groups else -1 for _, hw in pairs], np.int64)
    row_units = np.array([float(options.replica_units.get(m, 1.0)) for m, _ in pairs])
    sizes_g = [options.pinned_cores.get(hw, 1) for hw in groups]
    group_first = np.cumsum([0, *sizes_g])[:-1].astype(np.int64)
    group_pinned = np.array([hw in options.pinned_cores for hw in groups], dtype=bool)
    pool_cap = np.concatenate(
        [
            np.ones(options.pinned_cores[hw])
            if hw in options.pinned_cores
            else [float(options.shared_units[hw])]
            for hw in groups
        ]
        or [np.zeros(0)]
    ).astype(np.float64)
    group_size = np.array(sizes_g, dtype=np.int64)
    return row_group, row_units, group_first, group_size, group_pinned, pool_cap


_TABLES: dict[tuple[int, str, str, int], tuple[Profiles, np.ndarray]] = {}


def _latency_table(profiles: Profiles, model: str, hw: str, maxb: int) -> np.ndarray:
    """``table[b]`` = latency of a batch of b (cached: the planner asks for the same ones often)."""
    key = (id(profiles), model, hw, maxb)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is profiles:  # identity check: ids are reused after GC
        return hit[1]
    t = np.array(profiles.latency_table(model, hw, maxb), dtype=np.float64)
    with CACHE_LOCK:
        if len(_TABLES) > 4096:
            _TABLES.clear()
        _TABLES[key] = (profiles, t)
    return t

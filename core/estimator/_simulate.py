"""The estimator's entry point: :func:`simulate` drives the compiled kernel segment by segment
(between replica-schedule entries and controller calls) and summarizes the result."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig, Plan
from .._profiles import Profiles
from .._validate import as_float, as_int
from ..errors import ValidationError
from . import _estimator_kernel as K
from ._control import Controller, StageSwitch
from ._draws import visits
from ._options import EstimatorOptions
from ._prepare import Prep, check_arrivals, prepare
from ._results import ModelSimStats, SimResult
from ._state import ensure_events, ensure_slots, new_state, place, system_state
from ._stop import EarlyStop

__all__ = ["simulate", "simulate_plan"]


def simulate(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    arrivals: np.ndarray,
    *,
    options: EstimatorOptions = EstimatorOptions(),  # noqa: B008 (frozen)
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    schedule: Sequence[tuple[float, str, int]] = (),
    controller: Controller | None = None,
    variants: Mapping[str, Sequence[str]] | None = None,
    stop: EarlyStop | None = None,
) -> SimResult:
    """Simulate ``arrivals`` through ``pipeline`` served as ``configs``; see the package doc.

    Rules beyond docs/design.md's contract (all exercised by tests/core/test_estimator.py):

    * Visits: see :func:`draw_visits`. A query that visits no model has latency 0; a query
      that never finishes (a model left without replicas) has latency inf.
    * ``options.hop_overhead_s`` is added before every model's queue, roots included.
    * ``schedule``: ``(time_s, model, replicas)`` on the time axis of ``arrivals``;
      ``controller``: called at ``arrivals[0] + k * interval_s`` (k = 1, 2, ...) until every
      query has finished. A change at time T is applied after every event before T and before
      the events at T. The count set is active + pending replicas. Scale-up: billed from T,
      serving from T + ``activation_delay_s``. Scale-down: cancel pending replicas (latest
      first), then remove idle ones, then retire busy ones finishing soonest; a retired replica
      finishes its batch and is billed until then.
    * ``variants``: stage -> models of ``profiles`` (on the stage's hardware) the controller
      may switch the stage to with a :class:`StageSwitch`; the stage starts on its own
      profile (``profiles[stage]``). Replicas are billed at the stage's hardware price.
    * Static configurations (no schedule, no controller) must give every visited model a
      replica; they run as one compiled segment.
    * ``stop``: end the run as soon as its ``stop.percentile``-th latency is certain to exceed
      ``stop.slo_s`` (``_stop.py``; ``SimResult.stopped_early``). A run that does not stop is
      the same as without ``stop``; a controller is not called after the stop.
    """
    arr = check_arrivals(arrivals)
    prep = prepare(pipeline, configs, profiles, options, catalog, controller is not None, variants)
    order = prep.order
    pos = {m: j for j, m in enumerate(order)}
    sched = _check_schedule(schedule, pos)
    interval = 0.0
    if controller is not None:
        interval = as_float(getattr(controller, "interval_s", None), "controller.interval_s")
        if interval <= 0:
            raise ValidationError("controller.interval_s", "a number > 0", interval)
    N = arr.shape[0]
    vis, rem, left = visits(pipeline, N, options.seed)
    if not sched and controller is None:
        visited = vis.any(axis=0)
        for j, m in enumerate(order):
            if visited[j] and prep.replicas[j] == 0:
                raise ValidationError(
                    f"configs.{m}.replicas",
                    f"at least 1 replica ({m!r} receives traffic and nothing scales it)",
                    0,
                )
    S = _start(prep, arr, vis, rem, left, options, stop)
    place(S, prep, 0)
    delay = options.activation_delay_s
    switches: list[tuple[float, str, str]] = []
    if not sched and controller is None:
        K.run(S, np.inf)
    else:
        S = _drive(S, arr, order, pos, sched, controller, interval, delay, prep, configs, switches)
    return _result(S, prep, arr, vis, tuple(switches), stop is not None)


def _start(
    prep: Prep,
    arr: np.ndarray,
    vis: np.ndarray,
    rem: np.ndarray,
    left: np.ndarray,
    options: EstimatorOptions,
    stop: EarlyStop | None,
) -> K.KState:
    """The kernel's state at the start, with the admission and early stop set."""
    adm = options.admission
    if adm is not None and np.any(prep.waitv > 0.0):
        raise ValidationError(
            "options.admission", "no batch wait (batch_wait_s, batch_wait_ms) with admission", adm
        )
    a = None if adm is None else (adm.slo_s, adm.buffer_s)
    S = new_state(prep, arr, vis, rem, left, options.hop_overhead_s, options.seed, a)
    if stop is not None:
        if not isinstance(stop, EarlyStop):
            raise ValidationError("stop", "an EarlyStop or None", stop)
        N = arr.shape[0]
        S.ist[K.I_ALLOW] = stop.allowance(N)
        S.ist[K.I_SWEEP] = int(stop.drops_are_misses)
        S.ist[K.I_DALLOW] = N if stop.max_drops is None else stop.max_drops
        S.fst[K.F_SLO] = stop.slo_s
        if stop.max_refused is not None:
            S.ist[K.I_RALLOW] = stop.max_refused
    return S


def _check_schedule(
    schedule: Sequence[tuple[float, str, int]], pos: Mapping[str, int]
) -> list[tuple[float, int, int]]:
    out = []
    for i, e in enumerate(schedule):
        if len(e) != 3:
            raise ValidationError(f"schedule[{i}]", "(time_s, model, replicas)", e)
        t = as_float(e[0], f"schedule[{i}][0]")
        if e[1] not in pos:
            raise ValidationError(f"schedule[{i}][1]", f"a model from {list(pos)!r}", e[1])
        n = as_int(
            int(e[2]) if isinstance(e[2], np.integer) else e[2], f"schedule[{i}][2]", minimum=0
        )
        out.append((t, pos[e[1]], n))
    out.sort(key=lambda x: x[0])  # stable: same-time entries apply in the given order
    return out


def _drive(
    S: K.KState,
    arr: np.ndarray,
    order: tuple[str, ...],
    pos: Mapping[str, int],
    sched: list[tuple[float, int, int]],
    controller: Controller | None,
    interval: float,
    delay: float,
    prep: Prep | None = None,
    configs: Mapping[str, ModelConfig] | None = None,
    switches: list[tuple[float, str, str]] | None = None,
) -> K.KState:
    """Run in segments between schedule entries and controller calls (``switches`` collects
    the controller's variant switches)."""
    t0 = float(arr[0]) if arr.size else 0.0
    j = 0
    k = 1
    prev_ip = 0
    while True:
        ts = sched[j][0] if j < len(sched) else math.inf
        tc = t0 + k * interval if controller is not None else math.inf
        T = min(ts, tc)
        if T == math.inf:
            K.run(S, np.inf)
            return S
        nxt = K.run(S, T)
        if S.ist[K.I_STOP]:
            return S  # early stop: the verdict is known
        finished = nxt == math.inf and S.ist[K.I_INSYS] == 0
        if finished and int(S.ist[K.I_AP]) >= arr.shape[0]:
            return S  # nothing left to serve; later changes cannot affect any query
        changed = False
        while j < len(sched) and sched[j][0] == T:
            _, m, n = sched[j]
            S = ensure_slots(S, n)
            ns = int(S.ist[K.I_NSLOTS])
            K.apply_scale(S, m, n, T, delay)
            place(S, prep, ns)
            j += 1
            changed = True
        if controller is not None and tc == T:
            ip = int(np.searchsorted(arr, T, side="left"))
            state = system_state(S, order, T)
            want = controller.observe(T, arr[prev_ip:ip], state)
            prev_ip = ip
            k += 1
            if want:
                for name, n in want.items():
                    if name not in pos:
                        raise ValidationError(
                            "controller.observe()", f"model names from {list(order)!r}", name
                        )
                    if isinstance(n, StageSwitch):
                        row, n = _switch(S, prep, configs, pos[name], name, n)
                        S = ensure_slots(S, n)
                        S = ensure_events(S, S.rep_m.shape[0])
                        ns = int(S.ist[K.I_NSLOTS])
                        K.apply_switch(S, pos[name], row, n, T, delay)
                        place(S, prep, ns)
                        if switches is not None:
                            switches.append((T, name, want[name].variant))
                        changed = True
                        continue
                    if isinstance(n, ModelConfig):
                        n = _resize(S, prep, configs, pos[name], name, n)
                    if isinstance(n, np.integer):
                        n = int(n)
                    n = as_int(n, f"controller.observe()[{name!r}]", minimum=0)
                    if n != state.active_replicas[name] + state.pending_replicas[name]:
                        changed = True
                    S = ensure_slots(S, n)
                    ns = int(S.ist[K.I_NSLOTS])
                    K.apply_scale(S, pos[name], n, T, delay)
                    place(S, prep, ns)
            if nxt == math.inf and not changed and j >= len(sched):
                return S  # starved (no replicas) and the controller does not react


def _resize(
    S: K.KState,
    prep: Prep | None,
    configs: Mapping[str, ModelConfig] | None,
    j: int,
    name: str,
    c: ModelConfig,
) -> int:
    """A controller's ``ModelConfig`` for a model: its batch size applies to the next batch
    formed (batches in service finish as they are); returns the replica count to apply."""
    assert prep is not None and configs is not None
    where = f"controller.observe()[{name!r}]"
    if c.hardware != configs[name].hardware:
        raise ValidationError(
            f"{where}.hardware", f"the configured hardware {configs[name].hardware!r}", c.hardware
        )
    row = int(S.cur_row[j])
    top = prep.table.shape[1] - 1
    if c.max_batch_size > top or prep.table[row, c.max_batch_size] <= 0.0:
        raise ValidationError(
            f"{where}.max_batch_size", "at most the largest profiled batch size", c.max_batch_size
        )
    S.maxb[row] = c.max_batch_size
    return c.replicas


def _switch(
    S: K.KState,
    prep: Prep | None,
    configs: Mapping[str, ModelConfig] | None,
    j: int,
    name: str,
    sw: StageSwitch,
) -> tuple[int, int]:
    """A controller's ``StageSwitch``: the variant's table row (its batch size set), and the
    replica count."""
    assert prep is not None and configs is not None
    where = f"controller.observe()[{name!r}]"
    if not isinstance(sw.config, ModelConfig):
        raise ValidationError(f"{where}.config", "a ModelConfig", sw.config)
    row = j if sw.variant == name else prep.rows.get((name, sw.variant))  # own profile
    if row is None:
        have = [name, *sorted(v for s, v in prep.rows if s == name)]
        raise ValidationError(
            f"{where}.variant",
            f"the stage or a variant given to simulate() for it ({have!r})",
            sw.variant,
        )
    c = sw.config
    if c.hardware != configs[name].hardware:
        raise ValidationError(
            f"{where}.config.hardware",
            f"the configured hardware {configs[name].hardware!r}",
            c.hardware,
        )
    top = prep.table.shape[1] - 1
    if c.max_batch_size > top or prep.table[row, c.max_batch_size] <= 0.0:
        raise ValidationError(
            f"{where}.config.max_batch_size",
            f"at most the largest batch size profiled for {sw.variant!r}",
            c.max_batch_size,
        )
    S.maxb[row] = c.max_batch_size
    return row, as_int(c.replicas, f"{where}.config.replicas", minimum=0)


def _result(
    S: K.KState,
    p: Prep,
    arr: np.ndarray,
    vis: np.ndarray,
    switches: tuple[tuple[float, str, str], ...] = (),
    early: bool = False,
) -> SimResult:
    N = arr.shape[0]
    M = len(p.order)
    lat = S.fin - arr
    lat[S.left > 0] = np.inf
    t0 = float(arr[0]) if N else 0.0
    t1 = float(arr[-1]) if N else 0.0
    fin_ok = S.fin[np.isfinite(S.fin)]
    t_end = max(t1, float(fin_ok.max()) if fin_ok.size else t1)
    ns = int(S.ist[K.I_NSLOTS])
    rm = S.rep_m[:ns]
    req, act, stop, end = S.rep_req[:ns], S.rep_act[:ns], S.rep_stop[:ns], S.rep_end[:ns]
    # cost: billed from request to removal, clipped to the trace span
    if t1 > t0:
        billed = np.clip(end, t0, t1) - np.clip(req, t0, t1)
        cost = float(np.sum(billed * p.price[rm]) / (t1 - t0))
    else:
        cost = float(np.sum(p.replicas * p.price))
    # serving capacity for utilization: from activation to gone, within [t0, t_end]
    avail_per = np.clip(end, t0, t_end) - np.clip(act, t0, t_end)
    avail = np.bincount(rm, weights=np.maximum(avail_per, 0.0), minlength=M)
    qd = S.qd.reshape(N, M)
    visits = vis.sum(axis=0, dtype=np.int64)  # calls
    models: dict[str, ModelSimStats] = {}
    for j, m in enumerate(p.order):
        col = qd[:, j]
        ok = ~np.isnan(col)
        col = col[ok]  # with repeated calls: each visit's last call
        started = col.size if visits[j] == col.size else int(vis[ok, j].sum(dtype=np.int64))
        nb = int(S.nbatch[j])
        models[m] = ModelSimStats(
            visits=int(visits[j]),
            batches=nb,
            mean_batch_size=float(started / nb) if nb else 0.0,
            utilization=float(S.busy[j] / avail[j]) if avail[j] > 0 else 0.0,
            mean_queue_delay_s=float(col.mean()) if started else 0.0,
            p99_queue_delay_s=float(np.percentile(col, 99)) if started else 0.0,
        )
    return SimResult(
        arrivals_s=arr,
        latencies_s=lat,
        models=models,
        cost_per_hour=cost,
        replica_timeline=_timeline(rm, act, stop, p, t0),
        variant_switches=switches,
        rejected=_dropped(S, N, K.DROP_REJECTED),
        refused=_dropped(S, N, K.DROP_REFUSED),
        refused_late=_dropped(S, N, K.DROP_LATE),
        stopped_early=bool(S.ist[K.I_STOP]),
        stopped_at_s=float(S.fst[K.F_STOPT]) if S.ist[K.I_STOP] else None,
        certain_misses=int(S.ist[K.I_MISS]) if early else None,
    )


def _dropped(S: K.KState, N: int, why: int) -> np.ndarray:
    """Per query, whether a server batcher (or admission) dropped it for ``why``."""
    if S.drop.shape[0] != N:  # no server batcher, no admission: none
        return np.zeros(N, dtype=bool)
    return (S.drop & why) != 0


def _timeline(
    rm: np.ndarray, act: np.ndarray, stop: np.ndarray, p: Prep, t0: float
) -> tuple[tuple[float, str, int], ...]:
    """Serving replicas per model: the initial counts, then one entry per (time, model) change."""
    changes: list[tuple[float, int, int]] = []
    for s in range(rm.shape[0]):
        if np.isfinite(act[s]) and act[s] != -np.inf:
            changes.append((float(act[s]), int(rm[s]), 1))
        if np.isfinite(stop[s]) and act[s] != np.inf:
            changes.append((float(stop[s]), int(rm[s]), -1))
    start = min([t0, *(c[0] for c in changes)])
    count = [int(x) for x in p.replicas]
    out: list[tuple[float, str, int]] = [(start, m, count[j]) for j, m in enumerate(p.order)]
    changes.sort(key=lambda c: (c[0], c[1]))
    i = 0
    while i < len(changes):
        t, m, _ = changes[i]
        while i < len(changes) and changes[i][0] == t and changes[i][1] == m:
            count[m] += changes[i][2]
            i += 1
        out.append((t, p.order[m], count[m]))
    return tuple(out)


def simulate_plan(
    pipeline: Pipeline, plan: Plan, profiles: Profiles, arrivals: np.ndarray, **kw: Any
) -> SimResult:
    """:func:`simulate` with the plan's model configurations."""
    return simulate(pipeline, plan.models, profiles, arrivals, **kw)

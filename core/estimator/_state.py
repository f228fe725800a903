"""The kernel's simulation state: laid out at the start, grown when replicas are added, and
read back as what a controller sees (:class:`SystemState`)."""

from __future__ import annotations

import numpy as np

from . import _estimator_kernel as K
from ._control import SystemState
from ._draws import normals
from ._prepare import Prep

__all__ = ["ensure_events", "ensure_slots", "new_state", "place", "system_state"]


def new_state(
    p: Prep,
    arr: np.ndarray,
    vis: np.ndarray,
    rem: np.ndarray,
    left: np.ndarray,
    hop: float,
    seed: int = 0,
    admission: tuple[float, float] | None = None,
) -> K.KState:
    N = arr.shape[0]
    M = len(p.order)
    B = int(p.table.shape[1] - 1)  # a controller may raise batch sizes up to the table's
    NM = N * M
    visf = np.ascontiguousarray(vis).reshape(-1)
    server = bool(np.any(p.sbk != 0))
    use_wait = bool(np.any(p.waitv > 0)) or server  # a server batcher's queue is a FIFO
    # repeated calls (``Pipeline.visits``): a visit may enter its queue (and the hop FIFO)
    # more than once; each model's batch-wait FIFO then holds up to ``kmax * N`` entries
    kmax = int(visf.max()) if NM else 1
    calls = int(visf.sum(dtype=np.int64)) if kmax > 1 else NM
    S0 = int(p.replicas.sum())
    cap = max(16, 2 * S0)
    ist, fst = _scalars(S0, N, hop, admission)
    P = p.pool_cap.shape[0]
    ecap = 2 * cap + M + 8  # per slot: a completion or activation, and a switch's retirement
    return K.KState(
        arr=arr,
        vis=visf,
        ch_ptr=p.ch_ptr,
        ch_idx=p.ch_idx,
        is_root=p.is_root,
        maxb=p.maxb.copy(),
        table=p.table,
        wake_g=p.wake_g,
        wake_x=p.wake_x,
        wake_n=p.wake_n,
        spr_mu=p.spr_mu,
        spr_sig=p.spr_sig,
        zs=normals(NM, seed) if np.any(p.spr_sig > 0.0) else np.zeros(1),
        waitv=p.waitv,
        pool_cap=p.pool_cap,
        rem=rem.reshape(-1).copy(),
        left=left.copy(),
        ncall=np.zeros(NM if kmax > 1 else 1, dtype=np.uint8),
        fin=np.full(N, np.inf),
        enq=np.zeros(NM),
        qd=np.full(NM, np.nan),
        qheap=np.zeros(NM, dtype=np.int64),
        qlen=np.zeros(M, dtype=np.int64),
        fifo=np.zeros(NM * kmax if use_wait else 1, dtype=np.int64),
        fhead=np.zeros(M, dtype=np.int64),
        ftail=np.zeros(M, dtype=np.int64),
        wake_at=np.full(M, np.inf),
        hq_i=np.zeros(calls if hop > 0 else 1, dtype=np.int64),
        hq_m=np.zeros(calls if hop > 0 else 1, dtype=np.int64),
        hq_t=np.zeros(calls if hop > 0 else 1),
        ev_t=np.zeros(ecap),
        ev_k=np.zeros(ecap, dtype=np.int64),
        ev_a=np.zeros(ecap, dtype=np.int64),
        cur_row=np.arange(M, dtype=np.int64),
        inflight=np.zeros(M, dtype=np.int64),
        nbatch=np.zeros(M, dtype=np.int64),
        busy=np.zeros(M),
        dirty=np.zeros(M, dtype=np.uint8),
        dlist=np.zeros(M, dtype=np.int64),
        pool_dem=np.zeros(P),
        pool_n=np.zeros(P, dtype=np.int64),
        pool_list=np.zeros((P, cap), dtype=np.int64),
        pool_next=np.full(P, np.inf),
        ist=ist,
        fst=fst,
        **_replica_slots(p.replicas, cap, B),
        **_server_state(p, N, server or admission is not None),
    )


def _scalars(
    S0: int, N: int, hop: float, admission: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's scalar slots (``ist``, ``fst``); ``admission``: (slo_s, buffer_s)."""
    ist = np.zeros(17, dtype=np.int64)
    ist[K.I_NSLOTS] = S0
    ist[K.I_ALLOW] = -1  # early stop off unless ``simulate(stop=...)`` sets it
    ist[K.I_RALLOW] = N  # refusals allowed (early stop): all unless the stop limits them
    fst = np.zeros(6, dtype=np.float64)
    fst[K.F_HOP] = hop
    if admission is not None:
        ist[K.I_ADM] = 1
        fst[K.F_ASLO], fst[K.F_ABUF] = admission
    return ist, fst


def _server_state(p: Prep, N: int, server: bool) -> dict[str, np.ndarray]:
    """The server batchers' fields of ``KState`` (``sbk`` to ``drop``)."""
    M = len(p.order)
    return {
        "sbk": p.sbk,
        "sb_max": p.sb_max,
        "sb_size": p.sb_size,
        "sb_wait": p.sb_wait,
        "sb_tmo": p.sb_tmo,
        "sb_lim": p.sb_lim,
        "sb_enq": p.sb_enq,
        "sb_acc": np.zeros(M, dtype=np.int64),
        "sb_open": np.zeros(M),
        "sb_fly": np.zeros(M, dtype=np.int64),
        "drop": np.zeros(N if server else 1, dtype=np.uint8),  # per query where any
    }


def _replica_slots(replicas: np.ndarray, cap: int, B: int) -> dict[str, np.ndarray]:
    """The replica-slot arrays at the start (``KState`` fields ``rep_*`` and ``idle_head``):
    every model's replicas idle since ever (cold), on their stage's own table row."""
    M = replicas.shape[0]
    S0 = int(replicas.sum())
    rep_m = np.full(cap, -1, dtype=np.int64)
    rep_m[:S0] = np.repeat(np.arange(M, dtype=np.int64), replicas)
    rep_row = rep_m.copy()  # every replica starts on its stage's own row
    rep_st = np.full(cap, K.REMOVED, dtype=np.int64)
    rep_st[:S0] = K.IDLE
    rep_next = np.full(cap, -1, dtype=np.int64)
    idle_head = np.full(M, -1, dtype=np.int64)
    for s in range(S0):  # build each model's idle stack
        m = rep_m[s]
        rep_next[s] = idle_head[m]
        idle_head[m] = s
    return {
        "rep_m": rep_m,
        "rep_row": rep_row,
        "rep_st": rep_st,
        "rep_b": np.zeros(cap, dtype=np.int64),
        "rep_batch": np.zeros((cap, B), dtype=np.int64),
        "rep_next": rep_next,
        "rep_fin": np.where(np.arange(cap) < S0, -np.inf, np.inf),  # idle since ever: cold
        "rep_req": np.where(np.arange(cap) < S0, -np.inf, np.inf),
        "rep_act": np.where(np.arange(cap) < S0, -np.inf, np.inf),
        "rep_stop": np.full(cap, np.inf),
        "rep_end": np.full(cap, np.inf),
        "idle_head": idle_head,
        "rep_pool": np.full(cap, -1, dtype=np.int64),
        "rep_units": np.ones(cap),
        "rep_ppos": np.zeros(cap, dtype=np.int64),
        "rep_t0": np.zeros(cap),
    }


def ensure_slots(S: K.KState, extra: int) -> K.KState:
    """Grow the replica-slot and event arrays so ``extra`` more slots fit."""
    cap = S.rep_m.shape[0]
    need = int(S.ist[K.I_NSLOTS]) + extra
    if need <= cap:
        return S
    new = max(2 * cap, need)

    def grow(a: np.ndarray, fill: float) -> np.ndarray:
        out = np.full((new, *a.shape[1:]), fill, dtype=a.dtype)
        out[:cap] = a
        return out

    M = S.cur_row.shape[0]
    S = ensure_events(S, 2 * new + M + 8 - int(S.ist[K.I_EVN]))
    return S._replace(
        rep_m=grow(S.rep_m, -1),
        rep_row=grow(S.rep_row, -1),
        rep_st=grow(S.rep_st, K.REMOVED),
        rep_b=grow(S.rep_b, 0),
        rep_batch=grow(S.rep_batch, 0),
        rep_next=grow(S.rep_next, -1),
        rep_fin=grow(S.rep_fin, np.inf),
        rep_req=grow(S.rep_req, np.inf),
        rep_act=grow(S.rep_act, np.inf),
        rep_stop=grow(S.rep_stop, np.inf),
        rep_end=grow(S.rep_end, np.inf),
        rep_pool=grow(S.rep_pool, -1),
        rep_units=grow(S.rep_units, 1.0),
        rep_ppos=grow(S.rep_ppos, 0),
        rep_t0=grow(S.rep_t0, 0.0),
        pool_list=np.concatenate(
            [S.pool_list, np.zeros((S.pool_list.shape[0], new - cap), np.int64)], axis=1
        ),
    )


def place(S: K.KState, p: Prep | None, start: int) -> None:
    """Put replica slots ``start..`` (just requested) in their shared-core pools: a pinned
    replica on the least-used core of its hardware, lowest on ties (the bundled runtime's
    rule); an unpinned one in its hardware's one pool."""
    if p is None or p.pool_cap.shape[0] == 0:
        return
    ns = int(S.ist[K.I_NSLOTS])
    for s in range(start, ns):
        g = int(p.row_group[S.rep_row[s]])
        if g < 0:
            S.rep_pool[s] = -1
            continue
        lo = int(p.group_first[g])
        if not p.group_pinned[g]:
            S.rep_pool[s] = lo
            S.rep_units[s] = p.row_units[S.rep_row[s]]
            continue
        held = S.rep_pool[:s][S.rep_st[:s] != K.REMOVED]
        users = np.bincount(held[held >= lo] - lo, minlength=int(p.group_size[g]))
        S.rep_pool[s] = lo + int(np.argmin(users[: int(p.group_size[g])]))
        S.rep_units[s] = 1.0


def ensure_events(S: K.KState, extra: int) -> K.KState:
    """Grow the event heap so ``extra`` more events fit."""
    n = int(S.ist[K.I_EVN])
    if n + extra <= S.ev_t.shape[0]:
        return S
    ecap = max(2 * S.ev_t.shape[0], n + extra)
    ev_t = np.zeros(ecap)
    ev_k = np.zeros(ecap, dtype=np.int64)
    ev_a = np.zeros(ecap, dtype=np.int64)
    ev_t[:n], ev_k[:n], ev_a[:n] = S.ev_t[:n], S.ev_k[:n], S.ev_a[:n]
    return S._replace(ev_t=ev_t, ev_k=ev_k, ev_a=ev_a)


def system_state(S: K.KState, order: tuple[str, ...], now: float) -> SystemState:
    M = len(order)
    ns = int(S.ist[K.I_NSLOTS])
    rm, st = S.rep_m[:ns], S.rep_st[:ns]
    active = np.bincount(rm[(st == K.IDLE) | (st == K.BUSY)], minlength=M)
    pending = np.bincount(rm[st == K.PENDING], minlength=M)
    return SystemState(
        now_s=now,
        queued={m: int(S.qlen[j]) for j, m in enumerate(order)},
        in_service={m: int(S.inflight[j]) for j, m in enumerate(order)},
        active_replicas={m: int(active[j]) for j, m in enumerate(order)},
        pending_replicas={m: int(pending[j]) for j, m in enumerate(order)},
        in_system=int(S.ist[K.I_INSYS]),
    )

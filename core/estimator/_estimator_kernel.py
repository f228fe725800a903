"""Compiled event loop of the discrete-event estimator (numba ``@njit``, flat numpy arrays).

All mutable simulation state lives in the arrays of a :class:`KState` named tuple, so a run can
stop at any time ``t_stop`` (before the events of that instant) and resume later: the Python
driver (``_simulate.py``) uses this to apply replica schedules and controller decisions.

Indexing: models are numbered in topological order; a visit of query ``i`` to model ``m`` is the
flat index ``i * M + m``. A model (a pipeline stage) has one queue; its replicas may run
different model variants: each replica slot names a row of the latency table (``rep_row``),
rows ``0..M-1`` being the stages' own profiles and further rows their variants'
(:func:`apply_switch`). Because the trace is sorted and every query has the same SLO, the EDF
order (deadline, then arrival) is simply the query index, so each model's queue is a binary
min-heap of query indices.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = [
    "ACTIVATE",
    "BUSY",
    "COMPLETE",
    "IDLE",
    "PENDING",
    "REMOVED",
    "RETIRE",
    "RETIRING",
    "WAKE",
    "KState",
    "apply_scale",
    "apply_switch",
    "run",
]

# event kinds
COMPLETE = 0
ACTIVATE = 1
WAKE = 2
RETIRE = 3  # a replica of a stage's previous variant leaves (its successor serves now)
# replica states
PENDING = 0
IDLE = 1
BUSY = 2
RETIRING = 3  # busy, will leave after its batch
REMOVED = 4

# slots of the scalar arrays
I_AP = 0  # next arrival index
I_EVN = 1  # event-heap size
I_HQH = 2  # hop FIFO head
I_HQT = 3  # hop FIFO tail
I_INSYS = 4  # queries arrived and not finished
I_NSLOTS = 5  # replica slots in use
I_ND = 6  # dirty models this instant
# early stop (``_stop.py``): the misses allowed (-1: off), the certain misses counted, the
# deadline sweep's next query, whether the run stopped, whether drops are misses (and the
# deadline sweep on), and else the drops counted and allowed
I_ALLOW = 7
I_MISS = 8
I_OLD = 9
I_STOP = 10
I_SWEEP = 11
I_DROPS = 12
I_DALLOW = 13
# admission (``EstimatorOptions.admission``): on, the refusals counted and allowed (early stop)
I_ADM = 14
I_REF = 15
I_RALLOW = 16
F_NOW = 0
F_HOP = 1
F_SLO = 2  # early stop: the SLO a query's latency is judged against
F_STOPT = 3  # early stop: the instant the run stopped at
F_ASLO = 4  # admission: a query's deadline is its arrival plus this
F_ABUF = 5  # admission: the buffer subtracted from the deadline
# server batcher kinds and what befell a dropped query
SB_TRITON = 1
SB_TF = 2
DROP_REJECTED = 1  # Triton: its queue time reached the queue policy's timeout
DROP_REFUSED = 2  # TF Serving: the batch queue was full
DROP_LATE = 4  # admission: predicted late at arrival, or dropped late when a batch was cut

INF = np.inf


class KState(NamedTuple):
    """Every array the kernel reads or writes (static inputs first)."""

    arr: np.ndarray  # f8[N] arrival times
    vis: np.ndarray  # u1[N*M] calls per visit (0: not visited; more than 1: repeated calls)
    ch_ptr: np.ndarray  # i8[M+1] children CSR
    ch_idx: np.ndarray  # i8[E]
    is_root: np.ndarray  # u1[M]
    maxb: np.ndarray  # i8[R] batch size by table row
    table: np.ndarray  # f8[R, B+1] batch latency by size; rows 0..M-1: the stages, then variants
    wake_g: np.ndarray  # f8[R, G] idle times of the wake-up extras (WakeProfile.idle_s)
    wake_x: np.ndarray  # f8[R, G] the extras (WakeProfile.extra_s)
    wake_n: np.ndarray  # i8[R] points used per row (0: no wake-up extra)
    spr_mu: np.ndarray  # f8[R, B+1] log of the drawn service time's median (service spread)
    spr_sig: np.ndarray  # f8[R, B+1] its log-sd; 0: the batch takes ``table`` (no draw)
    zs: np.ndarray  # f8[N*M] standard normal per visit (one element when no row draws)
    waitv: np.ndarray  # f8[M] batch-wait timeout (0 = greedy; -1: a server batcher's FIFO)
    pool_cap: np.ndarray  # f8[P] units each pool has
    rem: np.ndarray  # i4[N*M] visited parents not yet finished
    left: np.ndarray  # i4[N] visits not yet finished
    ncall: np.ndarray  # u1[N*M] calls of the visit finished so far (one element: no repeats)
    fin: np.ndarray  # f8[N] finish time of the last finished visit
    enq: np.ndarray  # f8[N*M] time the visit entered the queue
    qd: np.ndarray  # f8[N*M] queueing delay (NaN until the visit starts)
    qheap: np.ndarray  # i8[M*N] per-model EDF heaps
    qlen: np.ndarray  # i8[M]
    fifo: np.ndarray  # i8[M*F] per-model insertion order, ``i * 256 + call`` (batch wait only)
    fhead: np.ndarray  # i8[M]
    ftail: np.ndarray  # i8[M]
    wake_at: np.ndarray  # f8[M] outstanding batch-wait timer (inf = none)
    hq_i: np.ndarray  # i8[cap] hop FIFO: query
    hq_m: np.ndarray  # i8[cap] hop FIFO: model
    hq_t: np.ndarray  # f8[cap] hop FIFO: time it enters the queue
    ev_t: np.ndarray  # f8[C] event heap
    ev_k: np.ndarray  # i8[C]
    ev_a: np.ndarray  # i8[C]
    rep_m: np.ndarray  # i8[S] model of each replica slot
    rep_row: np.ndarray  # i8[S] latency-table row (variant) of each replica slot
    rep_st: np.ndarray  # i8[S] state
    rep_b: np.ndarray  # i8[S] size of the batch in flight
    rep_batch: np.ndarray  # i8[S, B] queries of the batch in flight
    rep_next: np.ndarray  # i8[S] idle-stack link
    rep_fin: np.ndarray  # f8[S] finish time of the batch in flight; when idle, since when
    rep_req: np.ndarray  # f8[S] requested (billing starts)
    rep_act: np.ndarray  # f8[S] active (serving starts); inf if cancelled
    rep_stop: np.ndarray  # f8[S] stops taking work (scale-down)
    rep_end: np.ndarray  # f8[S] gone (billing ends)
    idle_head: np.ndarray  # i8[M]
    cur_row: np.ndarray  # i8[M] the row (variant) new replicas of each model run
    inflight: np.ndarray  # i8[M] queries in service
    nbatch: np.ndarray  # i8[M]
    busy: np.ndarray  # f8[M] replica-seconds spent processing
    dirty: np.ndarray  # u1[M]
    dlist: np.ndarray  # i8[M]
    pool_dem: np.ndarray  # f8[P] units the busy replicas of each pool take
    pool_n: np.ndarray  # i8[P] busy replicas per pool
    pool_list: np.ndarray  # i8[P, S] those replicas' slots
    pool_next: np.ndarray  # f8[P] the pool's next completion (inf: none)
    rep_pool: np.ndarray  # i8[S] the shared-core pool of each replica slot (-1: cores of its own)
    rep_units: np.ndarray  # f8[S] units (cores) the replica takes from its pool while busy
    rep_ppos: np.ndarray  # i8[S] a busy pooled replica's index in its pool's list
    rep_t0: np.ndarray  # f8[S] start of the batch in flight (a pooled batch's occupancy)
    # the servers' own batchers (``_batchers.py``); a model with one keeps its queue as a FIFO
    # in ``fifo`` (query indices; entries of one instant in index order) instead of the heap
    sbk: np.ndarray  # i8[M] its kind: 0 none, SB_TRITON, SB_TF
    sb_max: np.ndarray  # i8[M] the batcher's max batch size
    sb_size: np.ndarray  # i8[M, B+1] Triton: largest preferred size <= n (0: none); TF: padded n
    sb_wait: np.ndarray  # f8[M] Triton max queue delay; TF batch timeout (s)
    sb_tmo: np.ndarray  # f8[M] Triton queue timeout (s; 0: none)
    sb_lim: np.ndarray  # i8[M] batches at once (TF batch threads; Triton: no limit)
    sb_enq: np.ndarray  # i8[M] TF max enqueued batches
    sb_acc: np.ndarray  # i8[M] TF: end of the accepted entries in ``fifo`` (later: this instant's)
    sb_open: np.ndarray  # f8[M] TF: when the open batch's first request joined it
    sb_fly: np.ndarray  # i8[M] batches in flight
    drop: np.ndarray  # u1[N] DROP_REJECTED | DROP_REFUSED (one element: no server batcher)
    ist: np.ndarray  # i8 scalars (I_*)
    fst: np.ndarray  # f8 scalars (F_*)


@njit(cache=True, inline="always")
def _ev_push(ev_t, ev_k, ev_a, ist, t, k, a):  # type: ignore[no-untyped-def]
    i = ist[I_EVN]
    while i > 0:
        p = (i - 1) >> 1
        if ev_t[p] <= t:
            break
        ev_t[i] = ev_t[p]
        ev_k[i] = ev_k[p]
        ev_a[i] = ev_a[p]
        i = p
    ev_t[i] = t
    ev_k[i] = k
    ev_a[i] = a
    ist[I_EVN] += 1


@njit(cache=True, inline="always")
def _ev_pop(ev_t, ev_k, ev_a, ist):  # type: ignore[no-untyped-def]
    n = ist[I_EVN] - 1
    ist[I_EVN] = n
    if n == 0:
        return
    t = ev_t[n]
    k = ev_k[n]
    a = ev_a[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and ev_t[c + 1] < ev_t[c]:
            c += 1
        if ev_t[c] >= t:
            break
        ev_t[i] = ev_t[c]
        ev_k[i] = ev_k[c]
        ev_a[i] = ev_a[c]
        i = c
    ev_t[i] = t
    ev_k[i] = k
    ev_a[i] = a


@njit(cache=True, inline="always")
def _mark(dirty, dlist, ist, m):  # type: ignore[no-untyped-def]
    if dirty[m] == 0:
        dirty[m] = 1
        dlist[ist[I_ND]] = m
        ist[I_ND] += 1


@njit(cache=True, inline="always")
def _enqueue(qheap, qlen, enq, fifo, ftail, waitv, dirty, dlist, ist, N, M, i, m, t, c):  # type: ignore[no-untyped-def]
    base = m * N
    n = qlen[m]
    j = n
    while j > 0:  # sift up; usually stops at once since indices mostly arrive in order
        p = (j - 1) >> 1
        y = qheap[base + p]
        if y <= i:
            break
        qheap[base + j] = y
        j = p
    qheap[base + j] = i
    qlen[m] = n + 1
    enq[i * M + m] = t
    if waitv[m] > 0.0:  # c: the visit's call number (a stale entry of an earlier call is skipped)
        fifo[m * (fifo.shape[0] // M) + ftail[m]] = i * 256 + c
        ftail[m] += 1
    elif waitv[m] < 0.0:  # a server batcher's FIFO (the heap above is left unread)
        fifo[m * (fifo.shape[0] // M) + ftail[m]] = i
        ftail[m] += 1
    _mark(dirty, dlist, ist, m)


@njit(cache=True, nogil=True)
def run(S: KState, t_stop: float) -> float:
    """Process every instant strictly before ``t_stop``; return the next event time (inf: none).

    At each instant all arrivals, queue entries and completions are applied first, then every
    model touched at that instant dispatches batches to its idle replicas (docs/design.md rule 3).
    """
    return _loop(
        S.arr, S.vis, S.ch_ptr, S.ch_idx, S.is_root, S.maxb, S.table, S.wake_g, S.wake_x,
        S.wake_n, S.spr_mu, S.spr_sig, S.zs, S.waitv, S.pool_cap,
        S.rem, S.left, S.ncall,
        S.fin, S.enq, S.qd, S.qheap, S.qlen, S.fifo, S.fhead, S.ftail, S.wake_at, S.hq_i, S.hq_m,
        S.hq_t, S.ev_t, S.ev_k, S.ev_a, S.rep_m, S.rep_row, S.rep_st, S.rep_b, S.rep_batch,
        S.rep_next, S.rep_fin, S.rep_stop, S.rep_end, S.idle_head, S.cur_row, S.inflight,
        S.nbatch, S.busy, S.dirty, S.dlist, S.pool_dem, S.pool_n, S.pool_list, S.pool_next,
        S.rep_pool, S.rep_units, S.rep_ppos, S.rep_t0, S.sbk, S.sb_max, S.sb_size, S.sb_wait, S.sb_tmo,
        S.sb_lim, S.sb_enq, S.sb_acc, S.sb_open, S.sb_fly, S.drop, S.ist, S.fst, t_stop,
    )  # fmt: skip


# The loop takes every array as a plain argument: reading fields of the named tuple inside the
# hot loop makes numba emit atomic reference-count updates on every access (5x slower).
@njit(cache=True, nogil=True)
def _loop(  # type: ignore[no-untyped-def]
    arr, vis, ch_ptr, ch_idx, is_root, maxb, table, wake_g, wake_x, wake_n, spr_mu, spr_sig,
    zs, waitv, pool_cap, rem, left, ncall,
    fin, enq, qd, qheap, qlen, fifo, fhead, ftail, wake_at, hq_i, hq_m,
    hq_t, ev_t, ev_k, ev_a, rep_m, rep_row, rep_st, rep_b, rep_batch,
    rep_next, rep_fin, rep_stop, rep_end, idle_head, cur_row, inflight,
    nbatch, busy, dirty, dlist, pool_dem, pool_n, pool_list, pool_next,
    rep_pool, rep_units, rep_ppos, rep_t0, sbk, sb_max, sb_size, sb_wait, sb_tmo,
    sb_lim, sb_enq, sb_acc, sb_open, sb_fly, drop, ist, fst, t_stop,
):  # fmt: skip
    N = arr.shape[0]
    M = is_root.shape[0]
    P = pool_cap.shape[0]
    hop = fst[F_HOP]
    allow = ist[I_ALLOW]
    slo = fst[F_SLO]
    while True:
        ap = ist[I_AP]
        t = INF
        if ap < N:
            t = arr[ap]
        if ist[I_EVN] > 0 and ev_t[0] < t:
            t = ev_t[0]
        hh = ist[I_HQH]
        if hh < ist[I_HQT] and hq_t[hh] < t:
            t = hq_t[hh]
        for p in range(P):
            if pool_next[p] < t:
                t = pool_next[p]
        if t >= t_stop or t == INF:
            return t
        if allow >= 0 and (
            _sweep(arr, left, drop, ist, t, slo) > allow
            or ist[I_DROPS] > ist[I_DALLOW]
            or ist[I_REF] > ist[I_RALLOW]
        ):
            ist[I_STOP] = 1  # the verdict is known: over the SLO (nothing of t is applied)
            fst[F_STOPT] = t
            return t
        fst[F_NOW] = t
        # 1. arrivals enter every visited root (after the hop overhead)
        while ap < N and arr[ap] == t:
            i = ap
            ap += 1
            if left[i] == 0:  # visits no model at all
                fin[i] = t
                continue
            ist[I_INSYS] += 1
            for m in range(M):
                if is_root[m] and vis[i * M + m]:
                    if hop > 0.0:
                        h = ist[I_HQT]
                        hq_i[h] = i
                        hq_m[h] = m
                        hq_t[h] = t + hop
                        ist[I_HQT] = h + 1
                    else:
                        _enqueue(
                            qheap,
                            qlen,
                            enq,
                            fifo,
                            ftail,
                            waitv,
                            dirty,
                            dlist,
                            ist,
                            N,
                            M,
                            i,
                            m,
                            t,
                            0,
                        )
        ist[I_AP] = ap
        # 2. completions, activations, batch-wait timers; then the shared-core pools'
        # completions (outside the event heap: their times move whenever a pool's number of
        # busy replicas changes)
        while True:
            if ist[I_EVN] > 0 and ev_t[0] == t:
                kind = ev_k[0]
                s = ev_a[0]
                _ev_pop(ev_t, ev_k, ev_a, ist)
            else:
                s = -1
                for p in range(P):
                    if pool_next[p] == t:
                        for k in range(pool_n[p]):
                            if rep_fin[pool_list[p, k]] == t:
                                s = pool_list[p, k]
                                break
                        _pool_leave(
                            pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin,
                            p, s, rep_units[s], t,
                        )  # fmt: skip
                        busy[rep_m[s]] += t - rep_t0[s]
                        break
                if s < 0:
                    break
                kind = COMPLETE
            if kind == COMPLETE:
                m = rep_m[s]
                b = rep_b[s]
                inflight[m] -= b
                lo = ch_ptr[m]
                hi = ch_ptr[m + 1]
                for k in range(b):
                    i = rep_batch[s, k]
                    vi = i * M + m
                    if vis[vi] > 1:  # a repeated call: the next one enters m's queue
                        ncall[vi] += 1
                        if ncall[vi] < vis[vi]:
                            qd[vi] = np.nan  # queued again (qd: the last call's delay)
                            if hop > 0.0:
                                h = ist[I_HQT]
                                hq_i[h] = i
                                hq_m[h] = m
                                hq_t[h] = t + hop
                                ist[I_HQT] = h + 1
                            else:
                                _enqueue(
                                    qheap, qlen, enq, fifo, ftail, waitv, dirty, dlist, ist,
                                    N, M, i, m, t, ncall[vi],
                                )  # fmt: skip
                            continue
                    fin[i] = t  # completions come in time order: this ends as the last finish
                    left[i] -= 1
                    if left[i] == 0:
                        ist[I_INSYS] -= 1
                        # a late finish the deadline sweep has not counted yet (i >= I_OLD)
                        if allow >= 0 and i >= ist[I_OLD] and t - arr[i] > slo:
                            ist[I_MISS] += 1
                    for e in range(lo, hi):
                        c = ch_idx[e]
                        idx = i * M + c
                        if vis[idx]:
                            rem[idx] -= 1
                            if rem[idx] == 0:  # last visited parent: the join is complete
                                if hop > 0.0:
                                    h = ist[I_HQT]
                                    hq_i[h] = i
                                    hq_m[h] = c
                                    hq_t[h] = t + hop
                                    ist[I_HQT] = h + 1
                                else:
                                    _enqueue(
                                        qheap,
                                        qlen,
                                        enq,
                                        fifo,
                                        ftail,
                                        waitv,
                                        dirty,
                                        dlist,
                                        ist,
                                        N,
                                        M,
                                        i,
                                        c,
                                        t,
                                        0,
                                    )
                rep_b[s] = 0
                if sbk[m] != 0:  # a batch thread is free (a retiring replica's too)
                    sb_fly[m] -= 1
                    _mark(dirty, dlist, ist, m)
                if rep_st[s] == RETIRING:
                    rep_st[s] = REMOVED
                    rep_end[s] = t
                else:
                    rep_st[s] = IDLE
                    rep_next[s] = idle_head[m]
                    idle_head[m] = s
                    _mark(dirty, dlist, ist, m)
            elif kind == ACTIVATE:
                if rep_st[s] == PENDING:
                    m = rep_m[s]
                    rep_fin[s] = t  # idle since activation
                    rep_st[s] = IDLE
                    rep_next[s] = idle_head[m]
                    idle_head[m] = s
                    _mark(dirty, dlist, ist, m)
            elif kind == RETIRE:
                m = rep_m[s]
                if rep_row[s] != cur_row[m]:  # not if the stage switched back meanwhile
                    if rep_st[s] == IDLE:
                        _unlink_idle(idle_head, rep_next, m, s)
                        rep_st[s] = REMOVED
                        rep_stop[s] = t
                        rep_end[s] = t
                    elif rep_st[s] == BUSY:
                        rep_st[s] = RETIRING
                        rep_stop[s] = t
            else:  # WAKE (the argument is the model)
                if wake_at[s] == t:
                    wake_at[s] = INF
                _mark(dirty, dlist, ist, s)
        # 3. hop arrivals (after completions: a hop too small to move t lands in this instant)
        while ist[I_HQH] < ist[I_HQT] and hq_t[ist[I_HQH]] == t:
            h = ist[I_HQH]
            hi_ = hq_i[h]
            hm_ = hq_m[h]
            hc_ = ncall[hi_ * M + hm_] if vis[hi_ * M + hm_] > 1 else 0
            _enqueue(
                qheap, qlen, enq, fifo, ftail, waitv, dirty, dlist, ist, N, M, hi_, hm_, t, hc_
            )
            ist[I_HQH] = h + 1
        # 4. dispatch: idle replicas of every touched model take batches
        for d in range(ist[I_ND]):
            m = dlist[d]
            dirty[m] = 0
            if sbk[m] != 0:
                _sb_dispatch(
                    m, t, M, sbk, sb_max, sb_size, sb_wait, sb_tmo, sb_lim, sb_enq, sb_acc,
                    sb_open, sb_fly, drop, fifo, fhead, ftail, qlen, enq, qd, wake_at, ev_t, ev_k,
                    ev_a, ist, idle_head, rep_next, rep_st, rep_b, rep_batch, rep_row, rep_fin,
                    rep_pool, rep_units, rep_t0, rep_ppos, table, spr_mu, spr_sig, zs, wake_g,
                    wake_x, wake_n, pool_cap, pool_dem, pool_n, pool_list, pool_next, busy,
                    nbatch, inflight,
                )  # fmt: skip
                continue
            if ist[I_ADM]:  # admission, then Clockwork's cuts (as the live ``_cut_admitted``)
                if qlen[m] == 0:
                    continue
                _adm_arrivals(
                    m, t, N, M, arr, maxb, table, qheap, qlen, enq, drop, ist, fst, rep_st,
                    rep_m, rep_fin, cur_row,
                )  # fmt: skip
                base = m * N
                h = 0  # the queue is sorted: batches come off its front
                n = qlen[m]
                aslo = fst[F_ASLO]
                abuf = fst[F_ABUF]
                short = _adm_shortest(maxb, table, cur_row[m])
                while idle_head[m] >= 0 and h < n:
                    s = idle_head[m]
                    r = rep_row[s]
                    take = n - h
                    if take > maxb[r]:
                        take = maxb[r]
                    cut = table[r, take]  # the rule's latency: the batch before any drop
                    b = 0
                    while h < n and b < take:
                        i = qheap[base + h]
                        h += 1
                        if arr[i] + aslo - abuf < t + cut:
                            _adm_drop(drop, ist, i)
                        else:
                            rep_batch[s, b] = i
                            qd[i * M + m] = t - enq[i * M + m]
                            b += 1
                    if b == 0:
                        continue
                    idle_head[m] = rep_next[s]
                    rep_st[s] = BUSY
                    rep_b[s] = b
                    sg = spr_sig[r, b]
                    if sg > 0.0:  # drawn with the normal of the batch's first (EDF) visit
                        lat = np.exp(spr_mu[r, b] + sg * zs[rep_batch[s, 0] * M + m])
                    else:
                        lat = table[r, b]
                    if wake_n[r] > 0:
                        lat += _wake_extra(wake_g, wake_x, wake_n[r], r, t - rep_fin[s])
                    p = rep_pool[s]
                    if p >= 0:
                        _pool_join(
                            pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin,
                            p, s, rep_units[s], t, lat,
                        )  # fmt: skip
                        rep_t0[s] = t
                    else:
                        done = t + lat
                        rep_fin[s] = done
                        _ev_push(ev_t, ev_k, ev_a, ist, done, COMPLETE, s)
                        busy[m] += lat
                    nbatch[m] += 1
                    inflight[m] += b
                    # what is left and cannot make it even in the next batch is answered now,
                    # as the live queue does after each batch start (``doomed``)
                    thr = _adm_doom_at(m, t, short, ist, rep_st, rep_m, rep_fin)
                    while h < n and arr[qheap[base + h]] + aslo - abuf < thr:
                        _adm_drop(drop, ist, qheap[base + h])
                        h += 1
                rest = n - h
                for k in range(rest):  # still sorted, so still a heap
                    qheap[base + k] = qheap[base + h + k]
                qlen[m] = rest
                continue
            base = m * N
            w = waitv[m]
            while idle_head[m] >= 0 and qlen[m] > 0:
                n = qlen[m]
                s = idle_head[m]
                r = rep_row[s]
                B = maxb[r]
                if w > 0.0 and n < B:
                    # Delayed batching: wait until the batch fills or the oldest queued visit
                    # has waited w. Insertion order is enqueue-time order; skip taken visits.
                    fb = m * (fifo.shape[0] // M)
                    h = fhead[m]
                    while True:
                        code = fifo[fb + h]
                        vi = (code >> 8) * M + m
                        if np.isnan(qd[vi]) and (code & 255) == (ncall[vi] if vis[vi] > 1 else 0):
                            break
                        h += 1
                    fhead[m] = h
                    deadline = enq[vi] + w
                    if t < deadline:
                        if wake_at[m] == INF:
                            wake_at[m] = deadline
                            _ev_push(ev_t, ev_k, ev_a, ist, deadline, WAKE, m)
                        break
                b = B if n > B else n
                idle_head[m] = rep_next[s]
                rep_st[s] = BUSY
                rep_b[s] = b
                for k in range(b):
                    top = qheap[base]
                    n -= 1
                    if n > 0:  # sift the last element down from the root
                        x = qheap[base + n]
                        j = 0
                        while True:
                            c = 2 * j + 1
                            if c >= n:
                                break
                            if c + 1 < n and qheap[base + c + 1] < qheap[base + c]:
                                c += 1
                            y = qheap[base + c]
                            if y >= x:
                                break
                            qheap[base + j] = y
                            j = c
                        qheap[base + j] = x
                    rep_batch[s, k] = top
                    idx = top * M + m
                    qd[idx] = t - enq[idx]
                qlen[m] = n
                sg = spr_sig[r, b]
                if sg > 0.0:  # drawn with the normal of the batch's first (EDF) visit
                    lat = np.exp(spr_mu[r, b] + sg * zs[rep_batch[s, 0] * M + m])
                else:
                    lat = table[r, b]
                if wake_n[r] > 0:  # rep_fin: when this replica went idle
                    lat += _wake_extra(wake_g, wake_x, wake_n[r], r, t - rep_fin[s])
                p = rep_pool[s]
                if p >= 0:  # its pool's replicas share their cores: processor sharing
                    _pool_join(
                        pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin,
                        p, s, rep_units[s], t, lat,
                    )  # fmt: skip
                    rep_t0[s] = t
                else:
                    done = t + lat
                    rep_fin[s] = done
                    _ev_push(ev_t, ev_k, ev_a, ist, done, COMPLETE, s)
                    busy[m] += lat
                nbatch[m] += 1
                inflight[m] += b
        ist[I_ND] = 0


@njit(cache=True, inline="always")
def _sb_order(enq, fifo, fhead, ftail, M, m, t):  # type: ignore[no-untyped-def]
    """Put the entries model ``m``'s FIFO got at instant ``t`` (its tail) in index order:
    the order both sides agree on, whatever order the instant's events came in. Done here,
    not when enqueueing, because any extra work there slows every simulation."""
    fb = m * (fifo.shape[0] // M)
    lo = ftail[m]
    while lo > fhead[m] and enq[fifo[fb + lo - 1] * M + m] == t:
        lo -= 1
    for k in range(lo + 1, ftail[m]):  # insertion sort: the instant's entries are few
        x = fifo[fb + k]
        p = k
        while p > lo and fifo[fb + p - 1] > x:
            fifo[fb + p] = fifo[fb + p - 1]
            p -= 1
        fifo[fb + p] = x


@njit(cache=True, inline="always")
def _sb_drop(drop, ist, i, why):  # type: ignore[no-untyped-def]
    """Query ``i`` was rejected or refused: it never finishes (its first drop ends it)."""
    if drop[i] == 0:
        ist[I_INSYS] -= 1
        if ist[I_ALLOW] >= 0:
            if ist[I_SWEEP] == 0:  # drops are not misses: counted on their own
                ist[I_DROPS] += 1
            elif i >= ist[I_OLD]:  # a miss the deadline sweep has not counted
                ist[I_MISS] += 1
    drop[i] |= why


@njit(cache=True, inline="always")
def _sweep(arr, left, drop, ist, t, slo):  # type: ignore[no-untyped-def]
    """Early stop, at the start of instant ``t`` (every earlier event applied): a query still
    in the system whose ``t - arrival`` exceeds the SLO finishes at ``t`` or later, so it
    misses for certain. Queries are passed in arrival order, once each; finished and dropped
    ones were counted when they finished late or were dropped. Off where drops are not misses
    (a query late in a queue may yet be dropped). Returns the misses so far."""
    N = arr.shape[0]
    if ist[I_SWEEP] == 0:
        return ist[I_MISS]
    old = ist[I_OLD]
    while old < N and t - arr[old] > slo:
        if left[old] > 0 and (drop.shape[0] != N or drop[old] == 0):
            ist[I_MISS] += 1
        old += 1
    ist[I_OLD] = old
    return ist[I_MISS]


@njit(cache=True)
def _tf_accept(sb_max, sb_enq, sb_acc, sb_open, drop, fifo, fhead, ftail, qlen, ist, M, m, t):  # type: ignore[no-untyped-def]
    """TF Serving: this instant's requests join the open batch in order; one that does not
    fit starts a new batch, or is refused when ``max_enqueued_batches`` are held."""
    fb = m * (fifo.shape[0] // M)
    B = sb_max[m]
    w = sb_acc[m]
    held = w - fhead[m]  # accepted requests waiting: full batches, then the open one
    for r in range(sb_acc[m], ftail[m]):
        i = fifo[fb + r]
        if held % B == 0:  # the open batch is empty or full
            if held > 0 and held // B >= sb_enq[m]:
                _sb_drop(drop, ist, i, DROP_REFUSED)
                qlen[m] -= 1
                continue
            sb_open[m] = t  # its first request
        fifo[fb + w] = i
        w += 1
        held += 1
    sb_acc[m] = w
    ftail[m] = w


@njit(cache=True)
def _sb_dispatch(  # type: ignore[no-untyped-def]
    m, t, M, sbk, sb_max, sb_size, sb_wait, sb_tmo, sb_lim, sb_enq, sb_acc,
    sb_open, sb_fly, drop, fifo, fhead, ftail, qlen, enq, qd, wake_at, ev_t, ev_k,
    ev_a, ist, idle_head, rep_next, rep_st, rep_b, rep_batch, rep_row, rep_fin,
    rep_pool, rep_units, rep_t0, rep_ppos, table, spr_mu, spr_sig, zs, wake_g,
    wake_x, wake_n, pool_cap, pool_dem, pool_n, pool_list, pool_next, busy,
    nbatch, inflight,
):  # fmt: skip
    """Model ``m``'s server batcher at instant ``t`` (rules in ``_batchers.py``): batches
    from the head of its FIFO to idle replicas, or a wake-up when the batcher waits."""
    fb = m * (fifo.shape[0] // M)
    tf = sbk[m] == SB_TF
    _sb_order(enq, fifo, fhead, ftail, M, m, t)
    if tf:
        _tf_accept(sb_max, sb_enq, sb_acc, sb_open, drop, fifo, fhead, ftail, qlen, ist, M, m, t)
    B = sb_max[m]
    w = sb_wait[m]
    while idle_head[m] >= 0 and qlen[m] > 0 and sb_fly[m] < sb_lim[m]:
        h = fhead[m]
        if tf:
            n = qlen[m]
            if n >= B:  # a closed batch, or the open one full
                b = B
            else:  # the open batch alone: schedulable once its first request waited w
                due = sb_open[m] + w
                if t < due:
                    if wake_at[m] == INF:
                        wake_at[m] = due
                        _ev_push(ev_t, ev_k, ev_a, ist, due, WAKE, m)
                    return
                b = n
            cost = sb_size[m, b]  # padded to an allowed size
        else:
            tmo = sb_tmo[m]
            if tmo > 0.0:  # expired requests are a prefix (one timeout, FIFO order)
                while qlen[m] > 0 and t >= enq[fifo[fb + h] * M + m] + tmo:
                    _sb_drop(drop, ist, fifo[fb + h], DROP_REJECTED)
                    h += 1
                    qlen[m] -= 1
                fhead[m] = h
                if qlen[m] == 0:
                    return
            n = qlen[m]
            cap = B if n > B else n
            best = sb_size[m, cap]
            due = enq[fifo[fb + h] * M + m] + w
            late = w > 0.0 and t >= due
            if best > 0 and not late:
                b = best
            elif w == 0.0 or late:
                b = cap
            else:
                if wake_at[m] == INF:
                    wake_at[m] = due
                    _ev_push(ev_t, ev_k, ev_a, ist, due, WAKE, m)
                return
            cost = b
        s = idle_head[m]
        idle_head[m] = rep_next[s]
        rep_st[s] = BUSY
        rep_b[s] = b
        for k in range(b):
            i = fifo[fb + h + k]
            rep_batch[s, k] = i
            qd[i * M + m] = t - enq[i * M + m]
        fhead[m] = h + b
        qlen[m] -= b
        sb_fly[m] += 1
        r = rep_row[s]
        sg = spr_sig[r, cost]
        if sg > 0.0:  # drawn with the normal of the batch's first visit
            lat = np.exp(spr_mu[r, cost] + sg * zs[rep_batch[s, 0] * M + m])
        else:
            lat = table[r, cost]
        if wake_n[r] > 0:
            lat += _wake_extra(wake_g, wake_x, wake_n[r], r, t - rep_fin[s])
        p = rep_pool[s]
        if p >= 0:
            _pool_join(
                pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin,
                p, s, rep_units[s], t, lat,
            )  # fmt: skip
            rep_t0[s] = t
        else:
            done = t + lat
            rep_fin[s] = done
            _ev_push(ev_t, ev_k, ev_a, ist, done, COMPLETE, s)
            busy[m] += lat
        nbatch[m] += 1
        inflight[m] += b


@njit(cache=True, inline="always")
def _pool_rate(pool_cap, pool_dem, p):  # type: ignore[no-untyped-def]
    """Speed of each busy replica of pool ``p``: all of it until the pool's units are taken,
    then an equal share (processor sharing)."""
    d = pool_dem[p]
    return 1.0 if d <= pool_cap[p] else pool_cap[p] / d


@njit(cache=True)
def _pool_rescale(pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_fin, p, t, old):  # type: ignore[no-untyped-def]
    """The busy replicas of pool ``p`` went from speed ``old`` to the pool's current one at
    ``t``: move their finish times (their remaining work is unchanged) and the pool's next."""
    new = _pool_rate(pool_cap, pool_dem, p)
    f = old / new
    nxt = INF
    for k in range(pool_n[p]):
        s = pool_list[p, k]
        if f != 1.0:
            rep_fin[s] = t + (rep_fin[s] - t) * f
        if rep_fin[s] < nxt:
            nxt = rep_fin[s]
    pool_next[p] = nxt


@njit(cache=True, inline="always")
def _pool_join(
    pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin, p, s, u, t, lat
):  # type: ignore[no-untyped-def]
    """Slot ``s`` (taking ``u`` units) starts a batch of ``lat`` seconds' work at ``t``."""
    old = _pool_rate(pool_cap, pool_dem, p)
    pool_dem[p] += u
    k = pool_n[p]
    pool_list[p, k] = s
    rep_ppos[s] = k
    pool_n[p] = k + 1
    rep_fin[s] = t + lat / old  # at the old speed; the rescale moves it to the new one
    _pool_rescale(pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_fin, p, t, old)


@njit(cache=True, inline="always")
def _pool_leave(pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_ppos, rep_fin, p, s, u, t):  # type: ignore[no-untyped-def]
    """Slot ``s`` (taking ``u`` units) finishes its batch at ``t``."""
    old = _pool_rate(pool_cap, pool_dem, p)
    n = pool_n[p] - 1
    last = pool_list[p, n]
    k = rep_ppos[s]
    pool_list[p, k] = last
    rep_ppos[last] = k
    pool_n[p] = n
    pool_dem[p] = pool_dem[p] - u if n > 0 else 0.0  # no drift once the pool is idle
    _pool_rescale(pool_cap, pool_dem, pool_n, pool_list, pool_next, rep_fin, p, t, old)


@njit(cache=True, inline="always")
def _wake_extra(wake_g, wake_x, n, r, idle):  # type: ignore[no-untyped-def]
    """WakeProfile.extra of row ``r``: linear from (0, 0) through its points, flat after."""
    if idle <= 0.0:
        return 0.0
    if idle >= wake_g[r, n - 1]:
        return wake_x[r, n - 1]
    g0 = 0.0
    x0 = 0.0
    for k in range(n):
        g1 = wake_g[r, k]
        if idle < g1:
            return x0 + (wake_x[r, k] - x0) * (idle - g0) / (g1 - g0)
        g0 = g1
        x0 = wake_x[r, k]
    return x0


@njit(cache=True, inline="always")
def _unlink_idle(idle_head, rep_next, m, s):  # type: ignore[no-untyped-def]
    """Take slot ``s`` out of model ``m``'s idle stack."""
    if idle_head[m] == s:
        idle_head[m] = rep_next[s]
        return
    p = idle_head[m]
    while p >= 0:
        if rep_next[p] == s:
            rep_next[p] = rep_next[s]
            return
        p = rep_next[p]


@njit(cache=True, nogil=True)
def apply_scale(S: KState, m: int, n: int, t: float, delay: float) -> None:
    """Set model ``m``'s replica count (active + pending) of its current variant to ``n`` at
    time ``t``.

    Scale-up: new replicas are billed from ``t`` and serve from ``t + delay``. Scale-down:
    cancel pending replicas (latest first), then remove idle ones, then retire busy ones (the
    ones finishing soonest first), which leave after their batch. Replicas of a previous
    variant are not counted (they leave on their own, see :func:`apply_switch`). The caller
    guarantees slot and event-heap capacity.
    """
    row = S.cur_row[m]
    ns = S.ist[I_NSLOTS]
    cur = 0
    for s in range(ns):
        if S.rep_m[s] == m and S.rep_row[s] == row:
            st = S.rep_st[s]
            if st == PENDING or st == IDLE or st == BUSY:
                cur += 1
    if n > cur:
        for _ in range(n - cur):
            s = S.ist[I_NSLOTS]
            S.ist[I_NSLOTS] = s + 1
            S.rep_m[s] = m
            S.rep_row[s] = row
            S.rep_st[s] = PENDING
            S.rep_b[s] = 0
            S.rep_next[s] = -1
            S.rep_fin[s] = INF
            S.rep_req[s] = t
            S.rep_act[s] = t + delay
            S.rep_stop[s] = INF
            S.rep_end[s] = INF
            S.rep_pool[s] = -1  # the driver places it (``_estimator._place``)
            _ev_push(S.ev_t, S.ev_k, S.ev_a, S.ist, t + delay, ACTIVATE, s)
        return
    k = cur - n
    s = ns - 1
    while k > 0 and s >= 0:  # newer slots were requested later, so they activate later
        if S.rep_m[s] == m and S.rep_row[s] == row and S.rep_st[s] == PENDING:
            S.rep_st[s] = REMOVED
            S.rep_act[s] = INF
            S.rep_end[s] = t
            k -= 1
        s -= 1
    p = -1
    s = S.idle_head[m]
    while k > 0 and s >= 0:  # the idle stack from its top, skipping other variants
        nx = S.rep_next[s]
        if S.rep_row[s] == row:
            if p < 0:
                S.idle_head[m] = nx
            else:
                S.rep_next[p] = nx
            S.rep_st[s] = REMOVED
            S.rep_stop[s] = t
            S.rep_end[s] = t
            k -= 1
        else:
            p = s
        s = nx
    while k > 0:
        best = -1
        for s in range(ns):
            if S.rep_m[s] == m and S.rep_row[s] == row and S.rep_st[s] == BUSY:
                if best < 0 or S.rep_fin[s] < S.rep_fin[best]:
                    best = s
        if best < 0:
            break
        S.rep_st[best] = RETIRING
        S.rep_stop[best] = t
        k -= 1


@njit(cache=True, nogil=True)
def apply_switch(S: KState, m: int, row: int, n: int, t: float, delay: float) -> None:
    """Switch model ``m`` (a stage) to the variant of table row ``row`` with ``n`` replicas at
    time ``t``, in the live tuner's order: the new variant's replicas are billed from ``t``
    and serve from ``t + delay``; the previous variant's pending replicas are cancelled at
    once, its serving ones go at ``t + delay`` (a busy one after its batch) unless the stage
    has switched back by then. Until then both serve the stage's queue. The caller
    guarantees slot and event-heap capacity (one more event per slot).
    """
    old = S.cur_row[m]
    if row != old:
        S.cur_row[m] = row
        ns = S.ist[I_NSLOTS]
        for s in range(ns):
            if S.rep_m[s] != m or S.rep_row[s] == row:
                continue
            st = S.rep_st[s]
            if st == PENDING:
                S.rep_st[s] = REMOVED
                S.rep_act[s] = INF
                S.rep_end[s] = t
            elif st == IDLE or st == BUSY:
                _ev_push(S.ev_t, S.ev_k, S.ev_a, S.ist, t + delay, RETIRE, s)
    apply_scale(S, m, n, t, delay)


# -- admission by predicted completion (``EstimatorOptions.admission``, ``_admission.py``) ------
@njit(cache=True, inline="always")
def _adm_drop(drop, ist, i):  # type: ignore[no-untyped-def]
    """Query ``i`` was refused (at arrival or at a batch cut): it never finishes; a
    refusal is also a miss for the early stop (drops are misses, its deadline sweep)."""
    if drop[i] == 0:
        ist[I_INSYS] -= 1
        ist[I_REF] += 1
        if ist[I_ALLOW] >= 0:
            if ist[I_SWEEP] == 0:
                ist[I_DROPS] += 1
            elif i >= ist[I_OLD]:
                ist[I_MISS] += 1
    drop[i] |= DROP_LATE


@njit(cache=True, inline="always")
def _adm_shortest(maxb, table, r):  # type: ignore[no-untyped-def]
    """The shortest batch latency of row ``r`` over sizes 1..its max (``shortest_batch``);
    ``inf`` when none is known. A queued query's batch takes no less, whatever its size."""
    best = INF
    for b in range(1, maxb[r] + 1):
        lat = table[r, b]
        if lat > 0.0 and lat < best:
            best = lat
    return best


@njit(cache=True, inline="always")
def _adm_doom_at(m, t, short, ist, rep_st, rep_m, rep_fin):  # type: ignore[no-untyped-def]
    """The live queue's ``doomed`` threshold at ``t``: a queued query whose deadline minus
    the buffer is earlier than the earliest start (``t``, or later when every replica of
    ``m`` is busy past it) plus the ``short``-est batch cannot make it. ``-inf``: nothing is
    doomed (no replica, no latency)."""
    if short == INF:
        return -INF
    start = INF
    for s in range(ist[I_NSLOTS]):
        if rep_m[s] == m and (rep_st[s] == IDLE or rep_st[s] == BUSY):
            f = t if rep_st[s] == IDLE else rep_fin[s]
            if f < start:
                start = f
    if start == INF:
        return -INF
    if start < t:
        start = t
    return start + short


@njit(cache=True)
def predict_done(now, position, queued, free, nf, max_batch, lat_row):  # type: ignore[no-untyped-def]
    """``_admission.predict_completion`` over arrays: ``free[:nf]`` the replicas' free times
    (overwritten), ``lat_row[size]`` the batch latency (<= 0: none). ``-1.0``: no prediction
    (the pure function's None). The same float operations, so the same result."""
    if nf == 0 or position < 0 or position >= queued:
        return -1.0
    for k in range(nf):
        if free[k] < now:
            free[k] = now
    start = 0
    while True:
        j = 0  # the earliest free replica (any of a tie: the same time)
        for k in range(1, nf):
            if free[k] < free[j]:
                j = k
        size = queued - start
        if size > max_batch:
            size = max_batch
        lat = lat_row[size]
        if lat <= 0.0:
            return -1.0
        done = free[j] + lat
        if start + size > position:
            return done
        start += size
        free[j] = done


@njit(cache=True, inline="always")
def _adm_arrivals(
    m, t, N, M, arr, maxb, table, qheap, qlen, enq, drop, ist, fst, rep_st, rep_m, rep_fin, cur_row
):  # type: ignore[no-untyped-def]
    """Admission at instant ``t`` of the queries that entered model ``m``'s queue at ``t``,
    in EDF (index) order, each seeing the queue before ``t`` and those admitted before it.
    Leaves the queue sorted (a valid heap), refused ones out."""
    base = m * N
    n = qlen[m]
    q = qheap[base : base + n]
    slo = fst[F_ASLO]
    buf = fst[F_ABUF]
    # queued queries doomed since the last check (the live doom timer): they are gone
    # before anything that arrives now is predicted
    thr = _adm_doom_at(m, t, _adm_shortest(maxb, table, cur_row[m]), ist, rep_st, rep_m, rep_fin)
    old = 0
    doom = 0
    ordered = True
    for k in range(n):  # left sorted by the last cut; new entries may break the order
        if enq[q[k] * M + m] < t:
            if arr[q[k]] + slo - buf < thr:
                doom += 1
            else:
                old += 1
        if k > 0 and q[k - 1] > q[k]:
            ordered = False
    if doom == 0 and old == n and ordered:
        return  # nothing entered at t and nothing doomed: nothing to decide
    if not ordered:
        q.sort()
    ns = ist[I_NSLOTS]
    free0 = np.empty(ns)
    nf = 0
    idle = False
    for s in range(ns):
        if rep_m[s] == m and (rep_st[s] == IDLE or rep_st[s] == BUSY):
            free0[nf] = t if rep_st[s] == IDLE else rep_fin[s]
            if free0[nf] <= t:
                idle = True
            nf += 1
    r = cur_row[m]
    free = np.empty(nf)
    w = 0
    nadm = 0
    for k in range(n):
        i = q[k]
        if enq[i * M + m] < t:
            if arr[i] + slo - buf < thr:
                _adm_drop(drop, ist, i)
                continue
            q[w] = i
            w += 1
            continue
        ahead = old + nadm  # queued before it arrived
        ok = ahead == 0 and idle  # an idle replica, nothing queued: run it (as the live queue)
        if not ok:
            free[:nf] = free0[:nf]
            done = predict_done(t, w, ahead + 1, free, nf, maxb[r], table[r])
            ok = done < 0.0 or done <= arr[i] + slo - buf
        if ok:
            q[w] = i
            w += 1
            nadm += 1
        else:
            _adm_drop(drop, ist, i)
    qlen[m] = w

"""Candidate evaluations ahead of the search, in worker processes (issue 48).

The greedy search pops its candidate actions one at a time in order of a lower bound on
their cost and resolves each with a few estimator runs. With ``PlannerOptions.workers`` above
1 (on a planning trace of at least :data:`PARALLEL_MIN_QUERIES` queries), while the search
resolves the next candidate itself, forked workers resolve the ``workers - 1`` candidates
after it and send back the raw results of the simulations they ran; the search does not
wait for them, it takes what has come back whenever it starts workers again, and waits
only when it reaches a candidate a worker is still resolving. It takes
those results instead of simulating (``SearchSpace._pre_screen`` and ``_pre_exact``), in its
own order, so its decisions and counters are those of one process whatever the number of
workers: the estimator is deterministic, and the workers only ever save it time.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

from ._space import Key, SearchSpace

__all__ = ["PARALLEL_MIN_QUERIES", "Ahead", "collect", "start", "stop"]

PARALLEL_MIN_QUERIES = 200_000

Ahead = list[tuple[object, Any, Any]]  # (what it resolves, connection, process) per worker


def _child(conn: Any, space: SearchSpace, task: Callable[[], object]) -> None:
    space._log = []
    space._progress = None
    try:
        task()
    except Exception:  # a failed worker only loses its head start: the search recomputes
        pass
    # the pipe pickles, but only between forks of this one process (never a socket)
    conn.send(space._log)
    conn.close()


def start(space: SearchSpace, tasks: list[tuple[object, Callable[[], object]]]) -> Ahead:
    """Fork a worker per (tag, task) (each on a copy of the search as it is now)."""
    if not tasks or "fork" not in mp.get_all_start_methods():
        return []
    if threading.active_count() > 1:
        return []  # forking a threaded process can deadlock (the ladder plans in threads)
    ctx = mp.get_context("fork")
    out: Ahead = []
    for tag, task in tasks:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, space, task), daemon=True)
        proc.start()
        send.close()
        out.append((tag, recv, proc))
    return out


def collect(space: SearchSpace, ahead: Ahead, *, wait_for: object = None) -> Ahead:
    """Keep the results of the workers that are done (and of the one tagged ``wait_for``,
    waiting for it) that the search has not computed yet; the workers still running."""
    running: Ahead = []
    for tag, conn, proc in ahead:
        if tag != wait_for and not conn.poll():
            running.append((tag, conn, proc))
            continue
        try:
            log: list[tuple[str, Key, Any]] = conn.recv()
        except EOFError:
            log = []
        conn.close()
        proc.join()
        for kind, key, value in log:
            if kind == "x" and key not in space._exact:
                space._pre_exact.setdefault(key, value)
            elif kind == "s" and key not in space._cache:
                space._pre_screen.setdefault(key, value)
    return running


def stop(ahead: Ahead) -> None:
    """End the workers still running (their results are no longer needed)."""
    for _, conn, proc in ahead:
        proc.terminate()
        proc.join()
        conn.close()

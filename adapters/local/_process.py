"""The OS side of a local replica: its environment, its start-up line, stopping it, and no
orphans.

Every replica pid any ``LocalBackend`` started and has not yet reaped is kept in ``_LIVE_PIDS``
and killed at interpreter exit, so a parent that crashes out of its event loop leaves no
orphans (the replicas also watch their parent, for the case where the parent is killed
outright). Only a process whose parent is still this process is ever signalled (pid reuse).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

from inferline.core import BackendError

from . import _server
from ._handle import LocalReplica
from ._inventory import Placement
from ._server import TOKEN_ENV

__all__ = [
    "REPLICA_MODULE",
    "forget_pid",
    "kill",
    "kill_pids",
    "read_ready",
    "reap",
    "remember_pid",
    "replica_env",
    "terminate",
]

REPLICA_MODULE = __package__ + ".replica"

log = logging.getLogger(__name__)

_LIVE_PIDS: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _is_our_child(pid: int) -> bool:
    # Guards against pid reuse: only signal a process whose parent is still this process.
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return not os.path.isdir("/proc")  # no procfs (not Linux): trust the bookkeeping
    try:
        return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (IndexError, ValueError):
        return False


def kill_pids(pids: set[int]) -> None:
    """SIGKILL the replica processes in ``pids`` that are still ours, and forget them all."""
    with _LIVE_LOCK:
        for pid in list(pids):
            if pid in _LIVE_PIDS and _is_our_child(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            _LIVE_PIDS.discard(pid)
        pids.clear()


atexit.register(kill_pids, _LIVE_PIDS)


def remember_pid(pid: int) -> None:
    with _LIVE_LOCK:
        _LIVE_PIDS.add(pid)


def forget_pid(pid: int) -> None:
    with _LIVE_LOCK:
        _LIVE_PIDS.discard(pid)


def replica_env(extra: Mapping[str, str], token: str, threads: int, p: Placement) -> dict[str, str]:
    """The environment of a replica process: ours, ``extra``, the backend's secret, the thread
    limits of its libraries and only its own GPU."""
    env = dict(os.environ)
    env.update(extra)
    # in the environment, not the command line: other users can read argv in ps
    env[TOKEN_ENV] = token
    n = str(threads)
    for var in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    ):
        env[var] = n
    # A CPU replica must not grab a GPU by accident; a GPU replica sees exactly its own.
    env["CUDA_VISIBLE_DEVICES"] = p.gpu if p.gpu is not None else ""
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def read_ready(r: LocalReplica, url: str) -> dict[str, Any]:
    """The replica's ready line (its port, load time), or the reason it failed to start."""
    assert r.proc is not None and r.proc.stdout is not None
    while True:
        line = await r.proc.stdout.readline()
        if not line:  # EOF: the process exited before it was ready
            rc = await r.proc.wait()
            raise BackendError(
                url, f"replica {r.id} of {r.model!r} exited with code {rc} before it was ready"
            )
        text = line.decode("utf-8", "replace").strip()
        if text.startswith(_server.READY):
            return json.loads(text[len(_server.READY) :])
        if text.startswith(_server.ERROR):
            try:
                err = json.loads(text[len(_server.ERROR) :])
                why = f"{err.get('type')}: {err.get('message')}"
            except ValueError:
                why = text
            raise BackendError(
                url, f"replica {r.id} of {r.model!r} failed to load its container: {why}"
            )
        log.debug("replica %s stdout: %s", r.id, text)


async def reap(r: LocalReplica) -> None:
    """Wait (a bounded time) for a killed replica's exit watcher to finish its bookkeeping."""
    watchers = [t for t in r.tasks if t.get_name().startswith("watch-")]
    if watchers:
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(watchers[0]), 5.0)


def kill(r: LocalReplica) -> None:
    if r.proc is not None and r.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            r.proc.kill()


async def terminate(r: LocalReplica, grace_s: float = 2.0) -> None:
    """Stop the replica's tasks and process (SIGTERM, SIGKILL after ``grace_s``) and let its
    exit watcher finish."""
    for t in r.tasks:
        if t is not asyncio.current_task() and not t.get_name().startswith("watch-"):
            t.cancel()
    if r.proc is None:
        return
    if r.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            r.proc.terminate()
        try:
            await asyncio.wait_for(asyncio.shield(r.proc.wait()), grace_s)
        except TimeoutError:
            kill(r)
            await r.proc.wait()
    # Let the exit watcher finish its bookkeeping (pid sets, channel close).
    for t in r.tasks:
        if t.get_name().startswith("watch-") and t is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if r.channel is not None:
        with contextlib.suppress(Exception):
            await r.channel.close()

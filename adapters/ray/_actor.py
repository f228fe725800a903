"""The replica actor: one model container inside a Ray worker process on some node.

It loads the container exactly as a ``local://`` replica process does
(``inferline.adapters.local.load_container``: ``package.module:factory`` called with
``params``, then ``load()``), so a deployment moves between backends unchanged. The actor is
threaded (``max_concurrency``) so that ``ping`` and ``info`` answer while a batch runs; batches
themselves run one at a time under a lock (the queue sends one at a time anyway, and
containers need not be thread-safe).

With ``cfg["token"]`` set, the actor also serves the container over the bundled runtime's
replica gRPC service (``inferline.adapters.local.serve_grpc``, the same servicer a ``local://``
replica process runs) on its node's IP, sharing the container's lock and counters; ``ready()``
reports that address and the backend sends small batches there, past Ray's task path (see
``_handle``). Every call must carry the token.

Every node of the cluster needs inferline (and the containers' packages) importable in the
Python environment its Ray workers run: Ray imports this module there by name.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray

from inferline.adapters.local import ContainerStats, load_container, run_container, serve_grpc

from ._values import pack_outputs, writable

__all__ = ["THREAD_VARS", "ReplicaActor"]

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


class ReplicaActor:
    """Wrapped with ``ray.remote`` by the backend. Its hot methods do not report task events
    to the GCS (a served model makes hundreds of calls a second; the dashboard's task list
    does not show them).

    ``cfg``: ``model``, ``replica``, ``source``, ``params``, ``threads``, ``gpu`` (bool),
    ``token`` (the backend's secret for the gRPC port; absent: no gRPC server),
    ``max_message_bytes``.
    A container that fails to load does not fail the actor's creation (Ray would report it
    as an opaque death); ``ready()`` returns the error and the backend stops the actor.
    """

    def __init__(self, cfg: dict[str, Any]) -> None:
        self._model = str(cfg["model"])
        self._replica = str(cfg["replica"])
        threads = int(cfg.get("threads", 1))
        for var in THREAD_VARS:  # Ray sets OMP_NUM_THREADS from num_cpus; the others too
            os.environ[var] = str(threads)
        if not cfg.get("gpu"):
            # a CPU replica must not grab a GPU by accident (Ray leaves the variable unset)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self._node = ray.get_runtime_context().get_node_id()
        self._threads = threads
        self._stats = ContainerStats()
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._error: dict[str, str] | None = None
        self._container: Any = None
        t0 = time.perf_counter()
        try:
            self._container = load_container(
                str(cfg["source"]), dict(cfg.get("params") or {}), threads
            )
        except BaseException as e:  # reported by ready(); the backend decides
            self._error = {"type": type(e).__name__, "message": str(e)}
        self._stats.load_s = time.perf_counter() - t0
        self._grpc: dict[str, Any] = {}
        self._server: Any = None
        if self._container is not None and cfg.get("token"):
            self._serve(cfg)

    def _serve(self, cfg: dict[str, Any]) -> None:
        """Start the gRPC server; a failure is reported (``ready()["grpc"]["error"]``) and the
        backend keeps to Ray's path for this replica."""
        host = ray.util.get_node_ip_address()
        try:
            self._server, port = serve_grpc(
                self._container,
                {"model": self._model, "replica": self._replica, "threads": self._threads}
                | {"max_message_bytes": int(cfg.get("max_message_bytes", 64 << 20))},
                self._stats,
                host=host,
                token=str(cfg["token"]),
                lock=self._lock,
                busy=self._busy,
            )
        except Exception as e:
            self._grpc = {"error": f"{type(e).__name__}: {e}"}
            return
        self._grpc = {"host": host, "port": port}

    def ready(self) -> dict[str, Any]:
        """Where the actor runs and whether its container loaded."""
        return {
            "node": self._node,
            "pid": os.getpid(),
            "load_s": self._stats.load_s,
            "error": self._error,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "grpc": dict(self._grpc),
        }

    @ray.method(enable_task_events=False)
    def predict(self, inputs: Sequence[Any]) -> tuple[list[Any], dict[int, Any], float, str]:
        """``(outputs, error dicts by index, service seconds, batch error)``: when the
        container fails a batch, each input runs alone so that only the bad ones fail (as on
        ``local://``); a wrong output count is a batch error (the request's fault as far as
        retries go)."""
        if self._container is None:
            raise RuntimeError(f"replica {self._replica}: the container did not load")
        xs = [writable(x) for x in inputs]
        n = len(xs)
        with self._lock:
            self._busy.set()
            t0 = time.perf_counter()
            try:
                outs, failed = run_container(self._container, xs)
            finally:
                dt = time.perf_counter() - t0
                self._busy.clear()
        st = self._stats
        st.batches += 1
        st.items += n
        st.service_s.append(dt)
        st.errors += failed
        if outs is None or len(outs) != n:
            st.errors += 1
            got = "a non-sequence" if outs is None else f"{len(outs)} outputs"
            return [], {}, dt, f"model {self._model!r} returned {got} for a batch of {n} inputs"
        values, errors = pack_outputs(outs)
        return values, errors, dt, ""

    @ray.method(enable_task_events=False)
    def ping(self) -> bool:
        """Alive; ``True`` while a batch runs."""
        return self._busy.is_set()

    @ray.method(enable_task_events=False)
    def info(self) -> dict[str, Any]:
        d = self._stats.to_dict()
        d.update(node=self._node, pid=os.getpid(), threads=self._threads)
        return d

"""The driver's connection to a Ray cluster: one shared ``ray.init`` per process.

Ray allows one cluster connection per process. A ``RayBackend`` that finds the process not
connected calls ``ray.init`` itself and the last such backend to close calls ``ray.shutdown``;
a connection somebody else made (an application, a test) is used as it is and never shut
down here. Asking for a different cluster than the one the process is connected to is an
error.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import ray

from inferline.core import BackendError

__all__ = ["connect", "disconnect", "read_nodes"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_state = {"owned": False, "users": 0}


def _same_cluster(current: str, wanted: str) -> bool:
    if wanted == "auto":
        return True

    def norm(a: str) -> tuple[str, str]:
        host, _, port = a.rpartition(":")
        try:
            host = socket.gethostbyname(host)
        except OSError:
            pass
        return host, port

    return norm(current) == norm(wanted)


def connect(address: str, namespace: str, log_to_driver: bool) -> bool:
    """Make sure this process is connected to the cluster at ``address``. Returns whether the
    caller holds a share of a connection made here (and must ``disconnect()`` it)."""
    with _LOCK:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if not _same_cluster(current, address):
                raise BackendError(
                    f"ray://{address}",
                    f"this process is already connected to the Ray cluster at {current!r} "
                    "(Ray allows one cluster per process)",
                )
            if _state["owned"]:
                _state["users"] += 1
                return True
            return False
        try:
            ray.init(
                address=address,
                namespace=namespace,
                log_to_driver=log_to_driver,
                logging_level=logging.WARNING,
            )
        except Exception as e:  # ConnectionError, RuntimeError, ValueError from ray.init
            raise BackendError(
                f"ray://{address}", f"cannot connect to the Ray cluster: {type(e).__name__}: {e}"
            ) from None
        _state["owned"], _state["users"] = True, 1
        log.info("connected to the Ray cluster at %s", ray.get_runtime_context().gcs_address)
        return True


def disconnect() -> None:
    """Give back a share taken by ``connect``; the last one shuts the connection down."""
    with _LOCK:
        if _state["users"] > 0:
            _state["users"] -= 1
        if _state["users"] == 0 and _state["owned"]:
            _state["owned"] = False
            if ray.is_initialized():
                ray.shutdown()


def read_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()``: every node the cluster has known, alive or dead (blocking GCS call)."""
    return [dict(n) for n in ray.nodes()]

"""Registers backend scheme ``ray`` (entry point ``inferline:ray``).

``ray://HOST:PORT`` connects to the cluster whose GCS answers there (what ``ray start --head``
prints); ``ray://auto`` uses ``RAY_ADDRESS`` (else the cluster started on this machine).
Options ride in the query string, e.g. ``ray://10.0.0.5:6379?placement=pack&kinds=gpu-a10``;
keyword options given to ``PluginHost.backend_for`` override them.

This module does not import Ray: the scheme is listed even where the ``ray`` extra is not
installed, and using it then says how to install it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from inferline.core import Backend, BackendError, ValidationError

from ..hookspecs import BackendFactory, hookimpl

__all__ = ["inferline_backend_schemes", "make_backend", "query_options"]

_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_FLOATS = {
    "watch_interval_s",
    "heartbeat_interval_s",
    "heartbeat_timeout_s",
    "start_timeout_s",
    "drain_timeout_s",
}
_INTS = {
    "heartbeat_misses",
    "busy_heartbeat_misses",
    "max_start_failures",
    "max_concurrency",
    "object_store_min_bytes",
    "max_message_bytes",
}
_KEYS = {"placement", "namespace", "kinds", "log_to_driver"} | _FLOATS | _INTS


def query_options(url: str) -> dict[str, Any]:
    """The ``RayBackend`` keyword options a ``ray://`` URL's query string carries."""
    out: dict[str, Any] = {}
    for key, val in parse_qsl(urlsplit(url).query):
        where = f"{url}: {key}"
        if key not in _KEYS:
            raise ValidationError(where, f"a RayBackend option ({', '.join(sorted(_KEYS))})", key)
        try:
            if key == "placement":
                if val not in ("spread", "pack"):
                    raise ValueError(val)
                out[key] = val
            elif key == "namespace":
                out[key] = val
            elif key == "kinds":
                out[key] = tuple(k for k in val.split(",") if k)
            elif key == "log_to_driver":
                out[key] = _BOOL[val.lower()]
            elif key in _FLOATS:
                out[key] = float(val)
            else:
                out[key] = int(val)
        except (KeyError, ValueError):
            raise ValidationError(where, "a valid value", val) from None
    return out


def make_backend(url: str, options: Mapping[str, Any]) -> Backend:
    opts = {**query_options(url), **dict(options)}
    if importlib.util.find_spec("ray") is None:
        raise BackendError(url, "the ray:// backend needs Ray: pip install 'inferline[ray]'")
    from ._backend import RayBackend  # imports Ray: only when a ray:// backend is made

    return RayBackend(url, **opts)


@hookimpl
def inferline_backend_schemes() -> dict[str, BackendFactory]:
    return {"ray": make_backend}

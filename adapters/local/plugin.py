"""Registers the bundled runtime as backend scheme ``local`` (entry point ``inferline:local``).

``local://`` URLs may carry options as a query string, e.g.
``local://?oversubscribe=1&cores=0,1&gpu_kind=gpu-k80``; keyword options given to
``PluginHost.backend_for`` override them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from inferline.core import ValidationError

from ..hookspecs import BackendFactory, hookimpl
from ._backend import LocalBackend

_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_FLOATS = {
    "heartbeat_interval_s",
    "heartbeat_timeout_s",
    "start_timeout_s",
    "drain_timeout_s",
    "predict_timeout_s",
}


def _query_options(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in parse_qsl(urlsplit(url).query):
        where = f"{url}: {key}"
        try:
            if key in ("oversubscribe", "restart"):
                out[key] = _BOOL[val.lower()]
            elif key == "cores":
                out[key] = [int(c) for c in val.split(",") if c]
            elif key == "gpus":
                out[key] = [g for g in val.split(",") if g]
            elif key in _FLOATS:
                out[key] = float(val)
            elif key in (
                "heartbeat_misses",
                "busy_heartbeat_misses",
                "max_start_failures",
                "max_message_bytes",
            ):
                out[key] = int(val)
            elif key in ("gpu_kind", "python", "replica_log_level"):
                out[key] = val
            else:
                raise ValidationError(where, "a LocalBackend option", key)
        except (KeyError, ValueError):
            raise ValidationError(where, "a valid value", val) from None
    return out


def make_backend(url: str, options: Mapping[str, Any]) -> LocalBackend:
    return LocalBackend(url, **{**_query_options(url), **dict(options)})


@hookimpl
def inferline_backend_schemes() -> dict[str, BackendFactory]:
    return {"local": make_backend}

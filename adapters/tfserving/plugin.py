"""Registers the TF Serving adapter as backend schemes ``tfserving``, ``tfserving+rest`` and
``tfserving+grpc`` (entry point ``inferline:tfserving``).

Options can come as a URL query (``tfserving://host:8501?grpc_port=8500``) or as keyword
options to ``PluginHost.backend_for``; keyword options win. Importing this module does not
import TensorFlow: the gRPC stubs load on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hookspecs import BackendFactory, hookimpl
from ._backend import SCHEMES, TFServingBackend


def make_backend(url: str, options: Mapping[str, Any]) -> TFServingBackend:
    return TFServingBackend(url, **dict(options))


@hookimpl
def inferline_backend_schemes() -> dict[str, BackendFactory]:
    return dict.fromkeys(SCHEMES, make_backend)

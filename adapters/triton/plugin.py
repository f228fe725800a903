"""Registers the Triton adapter as backend schemes ``triton``, ``triton+http`` and
``triton+grpc`` (entry point ``inferline:triton``).

Options can come as a URL query (``triton://host:8000?cpu_cores=8&gpus=0,1``) or as keyword
options to ``PluginHost.backend_for``; keyword options win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hookspecs import BackendFactory, hookimpl
from ._backend import TritonBackend
from ._url import SCHEMES


def make_backend(url: str, options: Mapping[str, Any]) -> TritonBackend:
    return TritonBackend(url, **dict(options))


@hookimpl
def inferline_backend_schemes() -> dict[str, BackendFactory]:
    return dict.fromkeys(SCHEMES, make_backend)

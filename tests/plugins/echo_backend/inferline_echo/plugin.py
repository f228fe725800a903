"""The plugin module the ``inferline`` entry point names: a backend scheme, a hardware kind
and an observer, through inferline's public hooks only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from inferline.adapters import hookimpl
from inferline.core import Hardware, ModelConfig

from .backend import EchoBackend

CONFIG_EVENTS: list[tuple[str, ModelConfig | None, ModelConfig | None, str]] = []


def make_backend(url: str, options: Mapping[str, Any]) -> EchoBackend:
    q = {k: int(v) for k, v in parse_qsl(urlsplit(url).query)}
    return EchoBackend(url, **{**q, **dict(options)})


@hookimpl
def inferline_backend_schemes() -> dict[str, Any]:
    return {"echo": make_backend}


@hookimpl
def inferline_hardware_kinds() -> dict[str, Hardware]:
    return {"echo-accel": Hardware("gpu", 0.25)}


@hookimpl
def inferline_on_config_change(model: str, old: Any, new: Any, reason: str) -> None:
    CONFIG_EVENTS.append((model, old, new, reason))

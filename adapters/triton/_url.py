"""Triton URLs (``triton://host:8000``, ``triton+grpc://host:8001``) and how their query options
(``?cpu_cores=4&gpus=0,1``) are read."""

from __future__ import annotations

from urllib.parse import parse_qsl

from inferline.core import ValidationError

from .._remote import flag, split_url

__all__ = ["SCHEMES", "URL_OPTIONS", "parse_triton_url"]

# URL scheme -> protocol; the default ports are Triton's.
SCHEMES = {"triton": "http", "triton+http": "http", "triton+grpc": "grpc"}
_DEFAULT_PORT = {"http": 8000, "grpc": 8001}


def parse_triton_url(url: str) -> tuple[str, str, dict[str, str]]:
    """``triton://host:8000`` -> (protocol, "host:port", query options)."""
    protocol, parts = split_url(url, SCHEMES, "'triton://host:port' or 'triton+grpc://host:port'")
    host = parts.hostname
    if not host:
        raise ValidationError("url", "a host, e.g. 'triton://127.0.0.1:8000'", url)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range: urlsplit tells them apart, we need not
        port = 0
    if port == 0:  # ":0" read as no port took the default one silently
        raise ValidationError("url", "a port in [1, 65535]", url)
    port = port or _DEFAULT_PORT[protocol]
    host = f"[{host}]" if ":" in host else host
    return protocol, f"{host}:{port}", dict(parse_qsl(parts.query))


def _gpus(text: str) -> list[int]:
    return [int(g) for g in text.split(",") if g]


URL_OPTIONS = {  # option -> how to read it from the query text
    "oversubscribe": flag,
    "unload_on_close": flag,
    "cpu_cores": int,
    "gpus": _gpus,
    "timeout_s": float,
    "drain_timeout_s": float,
    "recovery_timeout_s": float,
    "watch_interval_s": float,
    "cpu_kind": str,
    "gpu_kind": str,
}

"""The TF Serving servers a backend drives: given (by URL hosts or a ``servers`` list) or
launched from a ``tensorflow_model_server`` binary on free loopback ports.

A server is an ``Endpoint``: its REST and gRPC addresses, its hardware kind, its whole model set
when known (a reload must carry it), and for a launched one its command, config file and
process. ``start_server`` / ``stop_server`` run a launched one; a launched server starts with
its model set written to its ``--model_config_file``, so a restart brings the same models back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult

from inferline.core import BackendError, ValidationError

from .._ports import free_port
from ._client import TFServingClient
from ._config import ServedModel, format_text, parse_text

__all__ = [
    "BINARY_ENV",
    "Endpoint",
    "find_model_server",
    "given_endpoints",
    "known_models",
    "launched_endpoints",
    "start_server",
    "stop_server",
]

log = logging.getLogger(__name__)

BINARY_ENV = "TENSORFLOW_MODEL_SERVER"


def find_model_server(binary: str | Sequence[str] | None = None) -> list[str] | None:
    """The command that starts a TF Serving server: ``binary``, ``$TENSORFLOW_MODEL_SERVER``
    (split like a shell word list) or ``tensorflow_model_server`` on PATH; None if none."""
    if binary:
        return shlex.split(binary) if isinstance(binary, str) else list(binary)
    env = os.environ.get(BINARY_ENV)
    if env:
        return shlex.split(env)
    found = shutil.which("tensorflow_model_server")
    return [found] if found else None


@dataclass(eq=False)
class Endpoint:
    """One TF Serving server: its REST and gRPC addresses and hardware kind."""

    rest: str | None
    grpc: str | None
    hardware: str = "cpu"
    models: dict[str, ServedModel] | None = None  # its whole model set, when known
    command: list[str] | None = None  # set when the backend launches it
    config_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    client: TFServingClient | None = None
    control: TFServingClient | None = None
    lock: asyncio.Lock | None = None

    @property
    def name(self) -> str:
        return self.rest or self.grpc or "?"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rest": self.rest,
            "grpc": self.grpc,
            "hardware": self.hardware,
            "launched": self.command is not None,
            "models": None if self.models is None else sorted(self.models),
        }


# -- which servers ------------------------------------------------------------------------------


def known_models(model_config_file: str | None) -> dict[str, ServedModel] | None:
    """The model set in the servers' ``--model_config_file`` (None: not given)."""
    if not model_config_file:
        return None
    try:
        text = Path(model_config_file).read_text()
    except OSError as e:
        raise ValidationError(
            "model_config_file", "a readable file", f"{model_config_file}: {e}"
        ) from None
    return {m.name: m for m in parse_text(text)}


def launched_endpoints(
    n: int, binary: str | Sequence[str] | None, hardware: str
) -> tuple[list[Endpoint], tempfile.TemporaryDirectory[str]]:
    """``n`` servers to launch on free loopback ports, each with an empty model set, and the
    temporary folder of their config files and logs (the caller removes it)."""
    cmd = find_model_server(binary)
    if cmd is None:
        raise ValidationError(
            "launch", f"a tensorflow_model_server binary (on PATH or ${BINARY_ENV})", None
        )
    tmp = tempfile.TemporaryDirectory(prefix="inferline-tfserving-")
    eps = []
    for i in range(n):
        ep = Endpoint(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", hardware, {})
        ep.command = cmd
        ep.config_path = Path(tmp.name) / f"server{i}.conf"
        eps.append(ep)
    return eps, tmp


def given_endpoints(
    parts: SplitResult,
    protocol: str,
    servers: Sequence[Mapping[str, Any]] | None,
    *,
    grpc_port: int | None,
    rest_port: int | None,
    hardware: str,
    known: dict[str, ServedModel] | None,
) -> list[Endpoint]:
    """The servers of a ``servers`` list, or else of the URL's hosts (``h1:8501,h2:8501``)."""
    eps: list[Endpoint] = []
    if servers:
        for i, s in enumerate(servers):
            s = dict(s)
            extra = set(s) - {"rest", "grpc", "hardware"}
            if extra or not (s.get("rest") or s.get("grpc")):
                raise ValidationError(f"servers[{i}]", "{rest, grpc, hardware} with an address", s)
            models = None if known is None else dict(known)
            eps.append(
                Endpoint(s.get("rest"), s.get("grpc"), str(s.get("hardware", hardware)), models)
            )
        return eps
    for host_port in parts.netloc.split(","):
        host, _, port_s = host_port.rpartition(":")
        if not host or not port_s.isdigit():
            raise ValidationError("url", "hosts as 'host:port' (comma-separated)", host_port)
        port = int(port_s)
        models = None if known is None else dict(known)
        if protocol == "rest":
            g = grpc_port if grpc_port is not None else (8500 if port == 8501 else None)
            eps.append(Endpoint(f"{host}:{port}", f"{host}:{g}" if g else None, hardware, models))
        else:
            r = rest_port
            eps.append(Endpoint(f"{host}:{r}" if r else None, f"{host}:{port}", hardware, models))
    return eps


# -- launched servers ---------------------------------------------------------------------------


async def start_server(ep: Endpoint, start_timeout_s: float, url: str) -> None:
    """Start a launched server with its model set and wait until it answers."""
    assert ep.command is not None and ep.config_path is not None and ep.rest and ep.grpc
    ep.config_path.write_text(format_text(list((ep.models or {}).values())))
    args = [
        *ep.command,
        f"--port={ep.grpc.rpartition(':')[2]}",
        f"--rest_api_port={ep.rest.rpartition(':')[2]}",
        f"--model_config_file={ep.config_path}",
    ]
    # tensorflow_model_server has no flag for its gRPC bind address: it listens on
    # 0.0.0.0 with no credentials (model_servers/server.cc), model reloads included.
    log.warning(
        "launching tensorflow_model_server: its gRPC port %s listens on all interfaces "
        "with no credentials; keep it behind a firewall or in its own network namespace",
        ep.grpc.rpartition(":")[2],
    )
    logf = open(ep.config_path.with_suffix(".log"), "ab")
    try:
        ep.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        logf.close()
    log.info("started TF Serving server pid %d (REST %s, gRPC %s)", ep.proc.pid, ep.rest, ep.grpc)
    assert ep.client is not None
    deadline = time.monotonic() + start_timeout_s
    while not await ep.client.ready(timeout_s=1.0):
        if ep.proc.poll() is not None:
            tail = ep.config_path.with_suffix(".log").read_bytes()[-500:].decode("utf-8", "replace")
            raise BackendError(url, f"server {ep.name} exited with {ep.proc.returncode}: {tail}")
        if time.monotonic() > deadline:
            raise BackendError(url, f"server {ep.name} not ready within {start_timeout_s} s")
        await asyncio.sleep(0.05)


def stop_server(ep: Endpoint) -> None:
    """Stop a launched server (terminate, then kill after 5 s)."""
    p = ep.proc
    if p is None or p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(5.0)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5.0)

"""The operator's TF Serving model sets as inferline first read them, and putting them back.

When attach stops (SIGTERM or ``inferline detach``) every server the operator runs gets back
the model set it had before inferline touched it: the models inferline added are unloaded,
the ones it adopted and scaled get their own entries back. The snapshot is JSON
(``{"kind": "tfserving", "url": ..., "servers": [{"rest", "grpc", "model_config"}]}``, the
config in ``--model_config_file`` text form holding each entry's own text), so ``inferline
detach`` can restore it after a crash with ``restore_snapshot(url, snapshot)`` alone.
Servers inferline launched itself are not in it: they stop with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferline.core import BackendError, ValidationError

from .._remote import bearer_headers
from ._client import TFServingClient, TFServingFailure, TFServingNotFound
from ._config import ServedModel, format_text, parse_text

__all__ = ["KIND", "make_snapshot", "reload_and_wait", "restore_snapshot", "snapshot_servers"]

KIND = "tfserving"


def make_snapshot(
    url: str, servers: Sequence[tuple[str | None, str | None, list[ServedModel]]]
) -> dict[str, Any]:
    """The snapshot of ``servers`` as (rest, grpc, model set)."""
    return {
        "kind": KIND,
        "url": url,
        "servers": [
            {"rest": rest, "grpc": grpc, "model_config": format_text(models)}
            for rest, grpc, models in servers
        ],
    }


def snapshot_servers(snapshot: Mapping[str, Any]) -> list[tuple[str, list[ServedModel]]]:
    """(gRPC address, model set) per server of a snapshot; ``ValidationError`` naming the
    field that is wrong."""
    if not isinstance(snapshot, Mapping) or snapshot.get("kind") != KIND:
        raise ValidationError(
            "snapshot.kind", repr(KIND), getattr(snapshot, "get", dict().get)("kind")
        )
    servers = snapshot.get("servers")
    if not isinstance(servers, list):
        raise ValidationError("snapshot.servers", "a list", servers)
    out = []
    for i, s in enumerate(servers):
        if not isinstance(s, Mapping) or not isinstance(s.get("grpc"), str) or not s["grpc"]:
            raise ValidationError(f"snapshot.servers[{i}].grpc", "host:port", s)
        text = s.get("model_config")
        if not isinstance(text, str):
            raise ValidationError(f"snapshot.servers[{i}].model_config", "model config text", text)
        out.append((s["grpc"], parse_text(text)))
    return out


async def reload_and_wait(
    client: TFServingClient, models: Sequence[ServedModel], url: str, timeout_s: float
) -> None:
    """Reload ``client``'s server with ``models`` and wait until those it did not serve
    before are AVAILABLE (the others were already there, or are the operator's to fix)."""
    gone = []
    for m in models:
        try:
            await client.status(m.name)
        except TFServingNotFound:
            gone.append(m.name)
    try:
        await client.reload(list(models), timeout_s=timeout_s)
    except TFServingFailure as e:
        raise BackendError(url, f"restoring the model set: {e}") from None
    deadline = time.monotonic() + timeout_s
    for name in gone:
        while True:
            try:
                if any(s["state"] == "AVAILABLE" for s in await client.status(name)):
                    break
            except TFServingNotFound:
                pass
            if time.monotonic() > deadline:
                raise BackendError(url, f"{name!r} not AVAILABLE again within {timeout_s} s")
            await asyncio.sleep(0.05)


async def restore_snapshot(
    url: str,
    snapshot: Mapping[str, Any],
    *,
    token: str | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Put back the model sets of ``snapshot`` (``TFServingBackend.operator_snapshot()``) on
    its servers, over gRPC (``url`` names the deployment in errors). Every server is tried;
    the failures are raised together at the end as ``BackendError``."""
    servers = snapshot_servers(snapshot)
    errors = []
    for grpc, models in servers:
        client = TFServingClient(
            None, grpc, "grpc", timeout_s=timeout_s, headers=bearer_headers(token)
        )
        try:
            await reload_and_wait(client, models, url, timeout_s)
        except (BackendError, TFServingFailure) as e:
            errors.append(f"{grpc}: {e}")
        finally:
            await client.close()
    if errors:
        raise BackendError(url, "model sets not restored on " + "; ".join(errors))

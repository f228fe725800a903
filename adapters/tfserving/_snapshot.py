"""The operator's TF Serving model sets as inferline first read them, and putting them back.

When attach stops (SIGTERM or ``inferline detach``) every server the operator runs gets back
the model set it had before inferline touched it: the models inferline added are unloaded,
the ones it adopted and scaled get their own entries back. The snapshot is JSON
(``{"kind": "tfserving", "url": ..., "servers": [{"rest", "grpc", "model_config"}]}``, the
config in ``--model_config_file`` text form holding each entry's own text), so ``inferline
detach`` can restore it after a crash with ``restore_snapshot(url, snapshot)`` alone.
Servers inferline launched itself are not in it: they stop with it.

Version directories inferline added under a model's base path (the steer path's, ``_versions``)
go too, without a moment where the model is unavailable: each server first serves the
operator's own versions beside the ones it serves now (``staged_entry``), then inferline's
directories are removed, then the operator's sets go back as they were read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferline.core import BackendError, ValidationError

from .._remote import bearer_headers
from ._client import TFServingClient, TFServingFailure, TFServingNotFound
from ._config import ServedModel, format_text, merged, parse_text, without_labels
from ._versions import added_versions, local_root_or_none, remove_added, staged_entry

__all__ = [
    "KIND",
    "make_snapshot",
    "reload_and_wait",
    "reload_staged",
    "remove_added_versions",
    "restore_snapshot",
    "snapshot_servers",
    "stage_operator_versions",
]

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


async def _wait_versions(
    client: TFServingClient, name: str, versions: set[int], deadline: float
) -> None:
    while time.monotonic() < deadline:
        try:
            st = await client.status(name)
        except TFServingNotFound:
            st = []
        if versions <= {s["version"] for s in st if s["state"] == "AVAILABLE"}:
            return
        await asyncio.sleep(0.05)


async def reload_staged(
    client: TFServingClient,
    models: Sequence[ServedModel],
    adding: Sequence[str],
    timeout_s: float,
) -> None:
    """Reload with ``models``; models in ``adding`` that carry version labels are loaded
    first without them, and labelled once the labelled versions are AVAILABLE: TF Serving
    refuses a label on a version still loading (FAILED_PRECONDITION, ``UpdateModelVersionLabelMap``
    in tensorflow_serving/model_servers/server_core.cc). A version that never comes leaves
    the final reload to fail with the server's own error."""
    labelled = [m for m in models if m.name in adding and m.labels]
    if labelled:
        first = merged({m.name: m for m in models}, put=[without_labels(m) for m in labelled])
        await client.reload(list(first.values()), timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        for m in labelled:
            await _wait_versions(client, m.name, {v for _, v in m.labels}, deadline)
    await client.reload(list(models), timeout_s=timeout_s)


async def reload_and_wait(
    client: TFServingClient, models: Sequence[ServedModel], timeout_s: float
) -> None:
    """Reload ``client``'s server with ``models`` and wait until those it did not serve
    before are AVAILABLE (the others were already there, or are the operator's to fix).
    Failures are ``TFServingFailure`` (DEADLINE_EXCEEDED for the wait)."""
    gone = []  # unknown, or only END versions left (TF Serving keeps those in its status)
    for m in models:
        try:
            if not any(s["state"] == "AVAILABLE" for s in await client.status(m.name)):
                gone.append(m.name)
        except TFServingNotFound:
            gone.append(m.name)
    await reload_staged(client, models, gone, timeout_s)
    deadline = time.monotonic() + timeout_s
    for name in gone:
        while True:
            try:
                if any(s["state"] == "AVAILABLE" for s in await client.status(name)):
                    break
            except TFServingNotFound:
                pass
            if time.monotonic() > deadline:
                raise TFServingFailure(
                    "DEADLINE_EXCEEDED", f"{name!r} not AVAILABLE again within {timeout_s} s"
                )
            await asyncio.sleep(0.05)


async def stage_operator_versions(
    client: TFServingClient, models: Sequence[ServedModel], timeout_s: float
) -> None:
    """Where inferline added version directories under an entry's base path: reload the
    operator's set with such entries as ``staged_entry`` (the operator's versions beside the
    served ones) and wait until those versions are AVAILABLE. Nothing where none was added."""
    staged = []
    own: dict[str, set[int]] = {}
    for m in models:
        try:
            st = await client.status(m.name)
        except TFServingNotFound:
            st = []
        e = staged_entry(m, [s["version"] for s in st if s["state"] == "AVAILABLE"])
        if e is not None:
            staged.append(e)
            own[m.name] = set(e.versions or ()) - {s["version"] for s in st}
    if not staged:
        return
    await reload_and_wait(
        client, list(merged({m.name: m for m in models}, put=staged).values()), timeout_s
    )
    deadline = time.monotonic() + timeout_s
    for name, versions in own.items():
        await _wait_versions(client, name, versions, deadline)


def remove_added_versions(models: Sequence[ServedModel]) -> list[str]:
    """Remove every version directory inferline added under the entries' base paths; what
    was removed, as ``path/version``."""
    out = []
    for m in models:
        root = local_root_or_none(m)
        if root is not None and added_versions(root):
            out += [f"{root}/{v}" for v in remove_added(root)]
    return out


async def restore_snapshot(
    url: str,
    snapshot: Mapping[str, Any],
    *,
    token: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, str]:
    """Put back the model sets of ``snapshot`` (``TFServingBackend.operator_snapshot()``) on
    its servers, over gRPC (``url`` names the deployment in errors); what was done per
    server. Every server is tried; the failures are raised together as ``BackendError``."""
    servers = snapshot_servers(snapshot)
    errors: list[str] = []
    done: dict[str, str] = {}
    clients = [
        (
            grpc,
            TFServingClient(None, grpc, "grpc", timeout_s=timeout_s, headers=bearer_headers(token)),
            models,
        )
        for grpc, models in servers
    ]
    try:
        for grpc, client, models in clients:  # the operator's versions serve first
            try:
                await stage_operator_versions(client, models, timeout_s)
            except TFServingFailure as e:
                errors.append(f"{grpc}: {e}")
        # a server still on inferline's version keeps its directory
        removed = [] if errors else remove_added_versions([m for _, ms in servers for m in ms])
        for grpc, client, models in clients:
            try:
                await reload_and_wait(client, models, timeout_s)
                done[grpc] = f"model set restored ({len(models)} models)"
            except TFServingFailure as e:
                errors.append(f"{grpc}: {e}")
    finally:
        for _, client, _ in clients:
            await client.close()
    if removed:
        done["removed versions"] = ", ".join(removed)
    if errors:
        raise BackendError(url, "model sets not restored on " + "; ".join(errors))
    return done

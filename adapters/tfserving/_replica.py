"""``TFServingReplica``: a model served by one TF Serving server, and the round trip of a
preformed batch (one predict request with the batch on axis 0; a batch the server rejects as
``INVALID_ARGUMENT`` is bisected so each bad query gets its own ``ValidationError``). What is
left of the batch's deadline (``core.BATCH_DEADLINE``) is the call's deadline; a call past it
is counted (``late_calls``) and its queries answered ``DeadlineExceededError``.

``_Managed`` is the backend's record of a model: its entry in the servers' model sets, the
signature it is called through, and its handles (one per server that serves it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inferline.core import ReplicaError, ValidationError, batch_call_timeout

from .._remote import ManagedModel
from .._replica import RemoteReplica, ReplicaOwner
from ._client import SERVER_LOST, TFServingFailure, TFServingInvalidArgument
from ._config import ServedModel
from ._protos import np_dtype
from ._servers import Endpoint

__all__ = ["TFServingReplica"]


@dataclass(kw_only=True)
class _Managed(ManagedModel):
    entry: ServedModel | None
    signature: str = "serving_default"
    version: int | None = None
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    output_dtypes: dict[str, str] = field(default_factory=dict)
    adopted: bool = False


class _Owner(ReplicaOwner, Protocol):
    """What a ``TFServingReplica`` needs of its backend."""

    def _lost(self, h: TFServingReplica, reason: str) -> None: ...


class TFServingReplica(RemoteReplica):
    """A model served by one TF Serving server."""

    _request_fault = TFServingInvalidArgument

    def __init__(self, backend: _Owner, managed: _Managed, ep: Endpoint, n: int) -> None:
        super().__init__(backend, managed.name, f"{managed.name}@{ep.name}#{n}", ep.hardware)
        self._backend = backend
        self._m = managed
        self.endpoint = ep
        self.batches = 0
        self.items = 0
        self.busy_s = 0.0
        self.by_size: dict[int, list[float]] = {}

    def figures(self) -> dict[str, Any]:
        """What this handle measured: batches, items, busy time, mean latency by batch size."""
        return {
            "batches": self.batches,
            "items": self.items,
            "busy_s": self.busy_s,
            "mean_latency_s_by_batch": {
                b: float(np.mean(v)) for b, v in sorted(self.by_size.items())
            },
        }

    async def _predict(self, inputs: list[Any]) -> list[Any]:
        t0 = time.perf_counter()
        m = self._m
        results: list[Any] = [None] * len(inputs)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for i, x in enumerate(inputs):
            try:
                enc = _encode(m, x, f"{m.name} input")
            except ValidationError as e:
                results[i] = e
                continue
            key = tuple((k, v.shape) for k, v in sorted(enc.items()))
            groups.setdefault(key, []).append((i, enc))
        for items in groups.values():
            await self._bisect(items, results)
        dt = time.perf_counter() - t0
        self.batches += 1
        self.items += len(inputs)
        self.busy_s += dt
        self.by_size.setdefault(len(inputs), []).append(dt)
        return results

    async def _send(
        self, items: list[tuple[int, dict[str, np.ndarray]]], results: list[Any]
    ) -> None:
        m, ep, url = self._m, self.endpoint, self._backend.url
        assert ep.client is not None
        batch = {k: np.stack([enc[k] for _, enc in items]) for k in items[0][1]}
        timeout, bound = batch_call_timeout(ep.client.timeout_s)
        try:
            # the loop's timer bounds it too: grpc's first deadline on a channel can lag
            async with asyncio.timeout(timeout if bound else None):
                outs = await ep.client.predict(
                    m.server_name,
                    batch,
                    signature=m.signature,
                    version=m.version,
                    output_dtypes=m.output_dtypes,
                    output_filter=m.outputs
                    if len(m.outputs) == 1 or m.spec.params.get("outputs")
                    else (),
                    timeout_s=timeout,
                )
        except TimeoutError:  # asyncio.timeout's, only set for a batch deadline
            raise self._late(m, len(items), "timed out") from None
        except TFServingFailure as e:
            if bound and _timed_out(e):  # cut at the batch's deadline: late, not lost
                raise self._late(m, len(items), str(e)) from None
            if isinstance(e, SERVER_LOST):
                self._backend._lost(self, str(e))
                raise ReplicaError(url, self._id, str(e)) from None
            if isinstance(e, self._request_fault):
                raise  # the server refused the request: bisected (_bisect)
            raise ReplicaError(url, self._id, str(e)) from None
        names = [n for n in m.outputs if n in outs] or list(outs)
        n = len(items)
        for k in names:
            if outs[k].ndim == 0 or outs[k].shape[0] != n:
                raise ReplicaError(
                    url, self._id, f"output {k!r} has shape {outs[k].shape}, not a batch of {n}"
                )
        for j, (i, _) in enumerate(items):
            results[i] = outs[names[0]][j] if len(names) == 1 else {k: outs[k][j] for k in names}

    def _refused(self, index: int, fault: Exception, results: list[Any]) -> None:
        m = self._m
        why = fault.message if isinstance(fault, TFServingFailure) else str(fault)
        results[index] = ValidationError(f"{m.name} input", f"an input {m.name!r} accepts", why)


def _timed_out(e: TFServingFailure) -> bool:
    """``e`` says the call ran out of its time (gRPC's deadline, or REST's read timeout)."""
    return e.code == "DEADLINE_EXCEEDED" or "timeout" in e.message.lower()


def _encode(m: _Managed, item: Any, where: str) -> dict[str, np.ndarray]:
    """One query as the model's named input arrays (checked against the signature)."""
    names = sorted(m.inputs)
    if isinstance(item, Mapping):
        if set(item) != set(names):
            raise ValidationError(where, f"named inputs {names}", sorted(map(str, item)))
        raw = dict(item)
    elif len(names) == 1:
        raw = {names[0]: item}
    else:
        raise ValidationError(where, f"a mapping of the named inputs {names}", type(item).__name__)
    out = {}
    for k in names:
        info = m.inputs[k]
        dt = info["dtype"]
        try:
            a = np.asarray(
                raw[k], dtype=object if dt == "DT_STRING" else np_dtype(dt, f"{where}.{k}")
            )
        except (TypeError, ValueError) as e:
            raise ValidationError(f"{where}.{k}", f"an array of {dt}", str(e)) from None
        shape = info.get("shape")
        if shape is not None and len(shape) >= 1:
            want = shape[1:]
            if a.ndim != len(want) or any(
                w >= 0 and w != g for w, g in zip(want, a.shape, strict=False)
            ):
                dims = ", ".join("*" if w < 0 else str(w) for w in want)
                raise ValidationError(f"{where}.{k}", f"shape ({dims})", tuple(a.shape))
        out[k] = a
    return out

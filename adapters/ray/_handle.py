"""The driver side of one replica actor: its ``ReplicaHandle``, and starting the actor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio
import ray
from ray.actor import ActorClass, ActorHandle
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from inferline.core import (
    BATCH_DEADLINE,
    BackendError,
    DeadlineExceededError,
    ReplicaError,
    batch_call_timeout,
)

from .._supervised import ACTIVE, DEAD, DRAINING, STARTING, STOPPED, SupervisedReplica
from ._direct import REQUEST_FAULTS, DirectPath, close_soon, target_of
from ._nodes import Demand
from ._values import payload_bytes, split_inputs, unpack_outputs

__all__ = ["ACTIVE", "DEAD", "DRAINING", "STARTING", "STOPPED", "RayReplica"]

log = logging.getLogger(__name__)

# what an idle direct path's first check may take before the replica keeps to Ray's path
_CHECK_TIMEOUT_S = 5.0


async def _answer(call: Any) -> Any:
    return await call


def ray_reason(e: BaseException) -> str:
    """``ActorDiedError: The actor died unexpectedly ...`` (first line only)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class RayReplica(SupervisedReplica):
    """One replica actor of a model (a ``ReplicaHandle``).

    ``node`` is the Ray node id the actor runs on (hex), ``address`` that node's IP. Batches
    go to the actor's own gRPC port (``direct``) below ``object_store_min_bytes`` and through
    Ray's object store at or above it; pings, stats and the actor's life stay with Ray. A replaced
    replica is a new ``RayReplica`` with a new ``id``, so a queue that keys its pullers by id
    never confuses the dead incarnation with its successor. ``on_failure(replica, reason)`` is
    the backend's word that the replica is gone (called when a batch finds the actor dead).
    """

    def __init__(
        self,
        url: str,
        model: str,
        rid: str,
        hardware: str,
        node: str,
        demand: Demand,
        on_failure: Callable[[RayReplica, str], None],
        address: str = "",
    ) -> None:
        super().__init__(model, rid, hardware)
        self._url = url
        self._on_failure = on_failure
        self.node = node
        self.address = address
        self.demand = demand
        self.actor: ActorHandle | None = None
        self.released = False  # its resources given back to the backend's bookkeeping
        # the data path: the actor's gRPC port below this many bytes per batch, else Ray's
        # object store (the backend sets it; 0: always the object store)
        self.object_store_min_bytes = 0
        self.direct: DirectPath | None = None
        self.direct_error = ""  # why this replica has no direct path (or stopped using it)
        self.grpc_batches = 0
        self.object_store_batches = 0
        # batch calls cut at the batch's deadline (core.BATCH_DEADLINE) and their queries
        self.late_calls = 0
        self.late_items = 0

    # -- ReplicaHandle (id, model, hardware, alive: SupervisedReplica) ---------------------

    def _repr_fields(self) -> str:
        return f"node={self.node[:8]!r}, state={self.state!r}"

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """One output (or ``InferlineError``) per input; ``ReplicaError`` if the batch failed
        because the replica did (actor dead, node lost), so the queue retries it elsewhere;
        ``DeadlineExceededError`` for a call cut at the batch's deadline
        (``core.BATCH_DEADLINE``). A batch of fewer than ``object_store_min_bytes`` goes to
        the actor's gRPC port, a larger one (or every one, without a port) through Ray."""
        if self.state != ACTIVE or self.died.done() or self.actor is None:
            raise ReplicaError(self._url, self._id, f"not accepting batches (state {self.state})")
        self.inflight += 1
        self.idle.clear()
        try:
            limit = self.object_store_min_bytes
            if self.direct is not None and payload_bytes(inputs, limit) < limit:
                return await self._via_grpc(self.direct, inputs)
            return await self._via_ray(inputs)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()

    async def _via_grpc(self, d: DirectPath, inputs: Sequence[Any]) -> list[Any]:
        n = len(inputs)
        req, bad = d.encode(inputs)
        if bad and len(bad) == n:
            return [bad[i] for i in range(n)]
        timeout, bound = batch_call_timeout(None)
        if bound and not timeout:
            raise self._late(n, "no time was left to send it")
        call = d.call(req, timeout)
        fut = asyncio.ensure_future(_answer(call))
        try:
            # the loop's timer as well as grpc's deadline: grpc's first one can lag ~0.2 s
            done, _ = await asyncio.wait(
                {fut, self.died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if self.died.done():
                raise ReplicaError(
                    self._url, self._id, f"died during a batch of {n}: {self.died.result()}"
                )
            if not done:  # only with a timeout, which is then the batch's deadline
                raise self._late(n, "the gRPC call was cancelled")
            if fut.cancelled():  # its channel was closed under it (the replica is going)
                raise ReplicaError(self._url, self._id, f"batch of {n} cancelled: channel closed")
            resp = fut.result()
        except grpc.aio.AioRpcError as e:
            return await self._grpc_failed(inputs, e, bound)
        finally:
            if not fut.done():  # cut, the replica died, or the caller was cancelled
                call.cancel()
                fut.cancel()
        out = d.decode(resp, n, bad, self._model)
        if out.batch_error:
            raise BackendError(self._url, out.batch_error)
        self.grpc_batches += 1
        return out.outputs

    async def _grpc_failed(
        self, inputs: Sequence[Any], e: grpc.aio.AioRpcError, bound: bool
    ) -> list[Any]:
        """What a failed direct call means. The port is the actor's, so Ray knows whether
        the replica lives: the batch is sent again through Ray, which reports a dead actor
        (``ReplicaError``, the replica replaced) or answers; then the port alone failed and
        this replica keeps to Ray's path from here on."""
        code = e.code()
        why = f"{code.name}: {e.details()}"
        if bound and code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise self._late(len(inputs), "the gRPC call passed it")
        if code in REQUEST_FAULTS:  # another replica would refuse it too: not retried
            raise BackendError(self._url, f"model {self._model!r} refused the batch: {why}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # past the message limit: Ray has none
            return await self._via_ray(inputs)
        if self.died.done():
            raise ReplicaError(self._url, self._id, f"failed during a batch: {why}")
        out = await self._via_ray(inputs)
        self.drop_direct(f"its gRPC port failed ({why}) while the actor answered through Ray")
        return out

    async def _via_ray(self, inputs: Sequence[Any]) -> list[Any]:
        url = self._url
        n = len(inputs)
        good, bad = split_inputs(inputs)
        if bad and len(bad) == n:
            return [bad[i] for i in range(n)]
        timeout, bound = batch_call_timeout(None)
        if bound and not timeout:
            raise self._late(n, "no time was left to send it")
        assert self.actor is not None
        ref = self.actor.predict.remote(good)
        fut = asyncio.wrap_future(ref.future())
        try:
            done, _ = await asyncio.wait(
                {fut, self.died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:  # only with a timeout, which is then the batch's deadline
                with contextlib.suppress(Exception):  # best effort: a running task finishes
                    ray.cancel(ref)
                raise self._late(n, "the actor call was cancelled")
            if fut not in done:
                raise ReplicaError(
                    url, self._id, f"died during a batch of {n}: {self.died.result()}"
                )
            try:
                values, errors, _service_s, batch_error = fut.result()
            except RayTaskError as e:  # the actor's method itself raised: not a dead replica
                raise BackendError(
                    url, f"replica {self._id} of {self._model!r} failed a batch: {ray_reason(e)}"
                ) from None
            except RayError as e:  # actor died or unreachable, result lost with its node
                reason = ray_reason(e)
                self._on_failure(self, reason)  # alive is False from here on
                raise ReplicaError(
                    url, self._id, f"failed during a batch of {n}: {reason}"
                ) from None
        finally:
            if not fut.done():  # the caller was cancelled or the replica died: stop waiting
                fut.cancel()
        if batch_error:
            raise BackendError(url, batch_error)
        if len(values) != len(good):
            raise BackendError(
                url, f"model {self._model!r} returned {len(values)} outputs for {len(good)} inputs"
            )
        self.object_store_batches += 1
        outs = unpack_outputs(values, errors)
        if bad:
            it = iter(outs)
            outs = [bad[i] if i in bad else next(it) for i in range(n)]
        return outs

    def _late(self, items: int, how: str) -> DeadlineExceededError:
        """A batch cut at its deadline: counted, and the error its queries get (the queue's
        expiry answer, not retried: another replica could only be later)."""
        self.late_calls += 1
        self.late_items += items
        return DeadlineExceededError(
            self._model,
            max(0.0, asyncio.get_running_loop().time() - BATCH_DEADLINE.get()),
            f"model {self._model!r}: replica {self._id} did not answer a batch of {items} "
            f"by its deadline ({how})",
        )

    def drop_direct(self, why: str) -> None:
        """Stop using the gRPC port (its channel closed in the background)."""
        if self.direct is None:
            return
        log.warning("replica %s of %r: %s; using Ray's path only", self._id, self._model, why)
        self.direct_error = why
        close_soon(self.direct)
        self.direct = None

    # -- used by the backend ----------------------------------------------------------------

    async def start(
        self, actor_class: ActorClass, cfg: dict[str, Any], max_concurrency: int, timeout_s: float
    ) -> dict[str, Any]:
        """Create the actor pinned to ``self.node`` and wait until its container is loaded;
        returns what ``ready()`` said. ``BackendError`` if it fails, does not load its
        container, or is not ready within ``timeout_s`` (or ``died`` resolves first)."""
        d = self.demand
        who = f"replica {self._id} of {self._model!r}"
        try:
            self.actor = actor_class.options(
                num_cpus=d.cpus,
                num_gpus=d.gpus,
                resources=d.custom(),
                max_concurrency=max_concurrency,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False),
            ).remote(cfg)
            ready = asyncio.wrap_future(self.actor.ready.remote().future())
        except Exception as e:  # Ray refused the request itself (options, connection)
            raise BackendError(self._url, f"{who}: Ray refused the actor: {e!r}") from None
        done, _ = await asyncio.wait(
            {ready, self.died}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            ready.cancel()
            why = (
                self.died.result()
                if self.died.done()
                else f"not ready within {timeout_s} s (are {d.resources()} free on node "
                f"{self.node[:8]}?)"
            )
            raise BackendError(self._url, f"{who}: {why}")
        try:
            info = dict(ready.result())
        except RayError as e:
            raise BackendError(self._url, f"{who} failed to start: {ray_reason(e)}") from None
        if info.get("error"):
            err = info["error"]
            raise BackendError(
                self._url,
                f"{who} failed to load its container: {err.get('type')}: {err.get('message')}",
            )
        self.node = str(info.get("node") or self.node)
        self.pid = int(info.get("pid") or 0)
        self.load_s = float(info.get("load_s") or 0.0)
        if cfg.get("token"):
            await self._connect(info.get("grpc") or {}, cfg, min(timeout_s, _CHECK_TIMEOUT_S))
        return info

    async def _connect(self, grpc_info: dict[str, Any], cfg: dict[str, Any], wait_s: float) -> None:
        """Open the direct path to the port the actor reported and check it answers; else log
        why and keep to Ray's path (a replica that works without it is still a replica)."""
        target = target_of(grpc_info)
        if not target:
            self.direct_error = f"the actor serves no gRPC port: {grpc_info.get('error')}"
        else:
            d = DirectPath(target, str(cfg["token"]), int(cfg["max_message_bytes"]))
            why = await d.check(wait_s)
            if not why:
                self.direct = d
                return
            close_soon(d)
            self.direct_error = f"its gRPC port {target} does not answer from here: {why}"
        log.warning(
            "replica %s of %r: %s; using Ray's path only", self._id, self._model, self.direct_error
        )

    async def ping(self, timeout_s: float) -> bool:
        """True when the actor answered within ``timeout_s``; raises ``RayError`` if it is
        dead."""
        if self.actor is None:
            return False
        fut = asyncio.wrap_future(self.actor.ping.remote().future())
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        return True

    async def info(self, timeout_s: float = 1.0) -> dict[str, Any]:
        if self.actor is None or self.died.done():
            return self.last_stats
        try:
            fut = asyncio.wrap_future(self.actor.info.remote().future())
            self.last_stats = dict(await asyncio.wait_for(fut, timeout_s))
        except (RayError, TimeoutError):
            pass
        return self.last_stats

    def _where(self) -> dict[str, Any]:
        return {"node": self.node, "address": self.address, "resources": self.demand.resources()}

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["data_path"] = {
            "grpc": self.direct.target if self.direct is not None else None,
            "object_store_min_bytes": self.object_store_min_bytes,
            "grpc_batches": self.grpc_batches,
            "object_store_batches": self.object_store_batches,
        }
        if self.direct_error:
            d["data_path"]["error"] = self.direct_error
        d["late_calls"] = self.late_calls
        d["late_items"] = self.late_items
        return d

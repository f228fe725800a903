"""The driver side of one replica actor: its ``ReplicaHandle``, and starting the actor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ray.actor import ActorClass, ActorHandle
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from inferline.core import BackendError, ReplicaError

from .._supervised import ACTIVE, DEAD, DRAINING, STARTING, STOPPED, SupervisedReplica
from ._nodes import Demand
from ._values import split_inputs, unpack_outputs

__all__ = ["ACTIVE", "DEAD", "DRAINING", "STARTING", "STOPPED", "RayReplica"]


def ray_reason(e: BaseException) -> str:
    """``ActorDiedError: The actor died unexpectedly ...`` (first line only)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class RayReplica(SupervisedReplica):
    """One replica actor of a model (a ``ReplicaHandle``).

    ``node`` is the Ray node id the actor runs on (hex), ``address`` that node's IP. A replaced
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

    # -- ReplicaHandle (id, model, hardware, alive: SupervisedReplica) ---------------------

    def _repr_fields(self) -> str:
        return f"node={self.node[:8]!r}, state={self.state!r}"

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """One output (or ``InferlineError``) per input; ``ReplicaError`` if the batch failed
        because the replica did (actor dead, node lost), so the queue retries it elsewhere."""
        url = self._url
        if self.state != ACTIVE or self.died.done() or self.actor is None:
            raise ReplicaError(url, self._id, f"not accepting batches (state {self.state})")
        n = len(inputs)
        good, bad = split_inputs(inputs)
        if bad and len(bad) == n:
            return [bad[i] for i in range(n)]
        self.inflight += 1
        self.idle.clear()
        fut = asyncio.wrap_future(self.actor.predict.remote(good).future())
        try:
            done, _ = await asyncio.wait({fut, self.died}, return_when=asyncio.FIRST_COMPLETED)
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
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()
        if batch_error:
            raise BackendError(url, batch_error)
        if len(values) != len(good):
            raise BackendError(
                url, f"model {self._model!r} returned {len(values)} outputs for {len(good)} inputs"
            )
        outs = unpack_outputs(values, errors)
        if bad:
            it = iter(outs)
            outs = [bad[i] if i in bad else next(it) for i in range(n)]
        return outs

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
        return info

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

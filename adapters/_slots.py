"""Slot bookkeeping shared by the backends that start their own replicas (local, Ray).

A model has *slots*: replica positions that survive their replica's replacements. A slot's
replica may die and be restarted (a local process) or replaced on another node (a Ray actor);
after ``max_start_failures`` failed starts in a row the slot is given up until the next
``scale()``. ``SlotKeeper`` holds what both backends do the same way with them: the active
replicas, all-or-nothing starts, removal, retrying given-up slots, the start-failure backoff
and the common part of ``stats()``. A backend implements ``_retire_slot`` and ``_restart``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferline.core import ModelConfig, ModelSpec, ReplicaHandle, ValidationError

from ._subscribers import ModelRegistry
from ._supervised import ACTIVE, SupervisedReplica

__all__ = ["ModelRecord", "Slot", "SlotKeeper", "check_source"]

log = logging.getLogger(__name__)


@dataclass
class Slot:
    """A replica position of a model; survives its replica's replacements."""

    index: int
    replica: Any = None  # the backend's SupervisedReplica, None between replicas
    restart_task: asyncio.Task[None] | None = None
    failures: int = 0  # consecutive failed starts
    restarts: int = 0
    given_up: bool = False  # restarts stopped after max_start_failures; scale() retries


@dataclass
class ModelRecord:
    spec: ModelSpec
    config: ModelConfig
    slots: list[Any] = field(default_factory=list)  # the backend's Slot subclass
    next_index: int = 0
    restarts: int = 0
    retired: list[dict[str, Any]] = field(default_factory=list)


def check_source(spec: ModelSpec) -> None:
    """A container a replica can import: ``package.module:factory`` with JSON-able params."""
    mod, sep, attr = spec.source.partition(":")
    if not sep or not mod or not attr:
        raise ValidationError(f"{spec.name}.source", "'package.module:factory'", spec.source)
    try:
        json.dumps(dict(spec.params))
    except (TypeError, ValueError):
        raise ValidationError(
            f"{spec.name}.params", "JSON-able keyword arguments", spec.params
        ) from None


class SlotKeeper(ModelRegistry):
    """The slot half of a self-supervising backend (see the module docstring)."""

    _models: dict[str, ModelRecord]
    max_start_failures: int

    async def _retire_slot(self, m: ModelRecord, s: Any) -> None:
        raise NotImplementedError

    async def _restart(self, m: ModelRecord, s: Any) -> None:
        raise NotImplementedError

    def replicas(self, model: str) -> list[ReplicaHandle]:
        m = self._get(model)
        return [s.replica for s in m.slots if s.replica is not None and s.replica.state == ACTIVE]

    async def remove(self, model: str) -> None:
        """Drain and stop every replica of ``model`` and forget it."""
        self._check_open()
        m = self._get(model)
        slots = list(m.slots)
        m.slots.clear()
        self._notify(model)
        await asyncio.gather(*(self._retire_slot(m, s) for s in slots))
        self._models.pop(model, None)

    def _retry_given_up(self, m: ModelRecord) -> None:
        # A slot given up on (it kept failing to start) is still counted, so a scale() to the
        # same count would do nothing: an explicit scale is the operator's (or the tuner's)
        # word to try those again.
        for s in m.slots:
            if s.given_up:
                s.given_up, s.failures = False, 0
                s.restart_task = asyncio.create_task(self._restart(m, s), name="restart-retry")

    async def _start_all(
        self, m: ModelRecord, slots: Sequence[Any], starts: list[Awaitable[Any]]
    ) -> None:
        """Run ``starts`` (one per new slot, already in ``m.slots``): all or nothing."""
        results = await asyncio.gather(*starts, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for s in slots:
                if s in m.slots:
                    m.slots.remove(s)
            self._notify(m.spec.name)
            await asyncio.gather(*(self._retire_slot(m, s) for s in slots))
            raise errors[0]

    @staticmethod
    async def _cancel_restart(s: Slot) -> None:
        if s.restart_task is not None and s.restart_task is not asyncio.current_task():
            s.restart_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await s.restart_task

    async def _stop_all_slots(self, m: ModelRecord) -> None:
        slots = list(m.slots)
        m.slots.clear()
        await asyncio.gather(*(self._retire_slot(m, s) for s in slots), return_exceptions=True)

    def _start_failed(self, m: ModelRecord, s: Slot, e: Exception, what: str) -> float | None:
        """Count a failed start of ``s``: the backoff before the next try, or None when the
        slot is given up (after ``max_start_failures`` in a row)."""
        s.failures += 1
        log.warning("%s %d of a %r replica failed: %s", what, s.failures, m.spec.name, e)
        if s.failures >= self.max_start_failures:
            log.error(
                "giving up on a replica of %r after %d failed starts (a scale() tries again)",
                m.spec.name,
                s.failures,
            )
            s.given_up = True
            return None
        return min(10.0, 0.2 * 2**s.failures)

    @staticmethod
    def _started(m: ModelRecord, s: Slot) -> None:
        s.failures = 0
        s.restarts += 1
        m.restarts += 1

    async def _stats_head(self, model: str, url: str) -> tuple[ModelRecord, dict[str, Any]]:
        """What both backends report of a model: counts, the replicas' own counters (fresh
        from the active ones) and activation delays."""
        m = self._get(model)
        live: list[SupervisedReplica] = [s.replica for s in m.slots if s.replica is not None]
        await asyncio.gather(*(r.info() for r in live if r.state == ACTIVE))  # type: ignore[attr-defined]
        reps = [r.describe() for r in live]
        delays = [d["activation_delay_s"] for d in reps + m.retired if d.get("activation_delay_s")]
        return m, {
            "model": model,
            "backend": url,
            "hardware": m.config.hardware,
            "threads": m.spec.threads,
            "target_replicas": len(m.slots),
            "active_replicas": sum(1 for r in live if r.state == ACTIVE),
            "restarts": m.restarts,
            "batches": sum(d.get("batches") or 0 for d in reps),
            "items": sum(d.get("items") or 0 for d in reps),
            "activation_delay_s": {
                "mean": sum(delays) / len(delays) if delays else None,
                "max": max(delays) if delays else None,
                "samples": len(delays),
            },
            "replicas": reps,
            "retired": list(m.retired[-50:]),
        }

"""``EchoBackend``: the whole ``inferline.core.Backend`` protocol, in process."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from inferline.core import (
    BackendError,
    CapacityError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ReplicaError,
    ReplicaHandle,
    ValidationError,
)

SPEEDUP = {"cpu": 1.0, "echo-accel": 2.0}


class EchoReplica:
    def __init__(self, backend: EchoBackend, spec: ModelSpec, hardware: str, rid: str) -> None:
        self._backend = backend
        self._spec = spec
        self._hw = hardware
        self._id = rid
        self.alive_flag = True
        self.batches = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def model(self) -> str:
        return self._spec.name

    @property
    def hardware(self) -> str:
        return self._hw

    @property
    def alive(self) -> bool:
        return self.alive_flag and not self._backend.closed

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self.alive:
            raise ReplicaError(self._backend.url, self._id, "replica stopped")
        p = self._spec.params
        cost = float(p.get("base_s", 0.002)) + float(p.get("per_item_s", 0.0005)) * len(inputs)
        await asyncio.sleep(cost / SPEEDUP[self._hw])
        self.batches += 1
        out: list[Any] = []
        for i, x in enumerate(inputs):
            try:
                a = np.asarray(x, dtype=np.float64)
            except (TypeError, ValueError):
                out.append(ValidationError(f"inputs[{i}]", "numbers", repr(x)[:40]))
                continue
            out.append(np.tanh(float(p.get("scale", 1.0)) * a))
        return out


class EchoBackend:
    def __init__(self, url: str = "echo://", cores: int = 4, accelerators: int = 1) -> None:
        self._url = url
        self._inv = {"cpu": int(cores), "echo-accel": int(accelerators)}
        self._models: dict[str, tuple[ModelSpec, ModelConfig, list[EchoReplica]]] = {}
        self._subs: list[Callable[[str, list[ReplicaHandle]], None]] = []
        self._ids = itertools.count()
        self.closed = False

    @property
    def url(self) -> str:
        return self._url

    def inventory(self) -> dict[str, int]:
        return dict(self._inv)

    def free(self) -> dict[str, int]:
        used = dict.fromkeys(self._inv, 0)
        for _spec, cfg, reps in self._models.values():
            used[cfg.hardware] += len(reps)
        return {k: max(0, v - used[k]) for k, v in self._inv.items()}

    def replicas(self, model: str) -> list[ReplicaHandle]:
        return [r for r in self._get(model)[2] if r.alive]

    def subscribe(self, callback: Callable[[str, list[ReplicaHandle]], None]) -> None:
        self._subs.append(callback)

    def _get(self, model: str) -> tuple[ModelSpec, ModelConfig, list[EchoReplica]]:
        if model not in self._models:
            raise NotFoundError("model", model, sorted(self._models))
        return self._models[model]

    def _notify(self, model: str) -> None:
        reps = self.replicas(model) if model in self._models else []
        for cb in list(self._subs):
            cb(model, reps)

    def _check(self) -> None:
        if self.closed:
            raise BackendError(self._url, "closed")

    def _new(self, spec: ModelSpec, hw: str, n: int) -> list[EchoReplica]:
        if hw not in self._inv:
            raise NotFoundError("hardware", hw, sorted(self._inv))
        if n > self.free()[hw]:
            raise CapacityError(f"{n} x {hw} wanted, {self.free()[hw]} free", self.free())
        return [EchoReplica(self, spec, hw, f"{spec.name}-{next(self._ids)}") for _ in range(n)]

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        self._check()
        if spec.name in self._models:
            raise ValidationError("model", "a model not deployed yet", spec.name)
        reps = self._new(spec, config.hardware, config.replicas)
        self._models[spec.name] = (spec, config, reps)
        self._notify(spec.name)

    async def scale(self, model: str, replicas: int) -> None:
        self._check()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        spec, cfg, reps = self._get(model)
        if replicas > len(reps):
            reps.extend(self._new(spec, cfg.hardware, replicas - len(reps)))
        else:
            for r in reps[replicas:]:
                r.alive_flag = False
            del reps[replicas:]
        self._models[model] = (spec, ModelConfig(cfg.hardware, cfg.max_batch_size, replicas), reps)
        self._notify(model)

    async def remove(self, model: str) -> None:
        self._check()
        await self.scale(model, 0)
        del self._models[model]

    async def stats(self, model: str) -> Mapping[str, Any]:
        _spec, cfg, reps = self._get(model)
        return {"model": model, "hardware": cfg.hardware, "batches": sum(r.batches for r in reps)}

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for name in list(self._models):
            for cb in list(self._subs):
                cb(name, [])
        self._models.clear()

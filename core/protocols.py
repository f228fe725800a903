"""The backend interface (the narrow waist), as typing Protocols.

They live in ``core`` so the queue in ``queueing`` can drive replicas without importing
``adapters``. A backend is addressed by URL (``local://``, ``triton://host:8000``,
``tfserving://host:8500``) and created through the plugin host in ``adapters``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._plan import ModelConfig
from ._validate import as_int, as_mapping, as_str, no_extra_keys, req

__all__ = [
    "BATCH_DEADLINE",
    "Backend",
    "ModelSpec",
    "ReplicaBase",
    "ReplicaHandle",
    "batch_call_timeout",
]

# When the batch a replica is sending stops being useful, in the event loop's time
# (``loop.time()``, the clock of the loop's timers): the dispatcher sets it around each ``predict_batch`` of a model that expires late queries
# (the batch's earliest deadline plus the queue's grace, when those queries would expire
# anyway); ``inf`` when nothing bounds the call. A handle carries what is left of it to its
# server (a call deadline) and answers ``DeadlineExceededError`` when it passes.
BATCH_DEADLINE: ContextVar[float] = ContextVar("inferline_batch_deadline", default=math.inf)


def batch_call_timeout(default_s: float | None) -> tuple[float | None, bool]:
    """The timeout of one backend call for the current batch: ``default_s`` or what is left
    of ``BATCH_DEADLINE``, whichever is shorter, and whether the batch deadline is the bound
    (a call that then times out was cut at the deadline, not lost)."""
    due = BATCH_DEADLINE.get()
    if due == math.inf:
        return default_s, False
    left = due - asyncio.get_running_loop().time()
    if default_s is not None and default_s <= left:
        return default_s, False
    return max(left, 0.0), True


@dataclass(frozen=True)
class ModelSpec:
    """What to deploy.

    ``source`` is backend-specific: for ``local://`` an import path ``package.module:factory``
    whose call with ``params`` as keyword arguments returns a model container; for Triton or TF
    Serving the model's name on the server (defaults to ``name``). ``threads`` is the number of
    compute threads each replica may use (torch/BLAS threads, or CPU cores pinned).
    """

    name: str
    source: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    version: str = "1"
    threads: int = 1

    def __post_init__(self) -> None:
        as_str(self.name, "name")
        as_int(self.threads, "threads", minimum=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "params": dict(self.params),
            "version": self.version,
            "threads": self.threads,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> ModelSpec:
        m = as_mapping(d, where)
        no_extra_keys(m, {"name", "source", "params", "version", "threads"}, where)
        return cls(
            name=as_str(req(m, "name", where), f"{where}.name"),
            source=str(m.get("source", "")),
            params=dict(as_mapping(m.get("params", {}), f"{where}.params")),
            version=str(m.get("version", "1")),
            threads=as_int(m.get("threads", 1), f"{where}.threads", minimum=1),
        )


@runtime_checkable
class ReplicaHandle(Protocol):
    """One replica of a deployed model.

    ``predict_batch`` returns exactly one entry per input: an output, or an ``InferlineError``
    instance for an input that failed on its own. It raises ``ReplicaError`` when the whole
    batch failed (replica died, connection lost); the queue then retries the batch elsewhere
    or answers every query of it with that error.
    """

    @property
    def id(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def hardware(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]: ...


class ReplicaBase:
    """The ``ReplicaHandle`` identity: ``id``, ``model`` and ``hardware``, written once.

    ``hardware`` may change under a handle when its backend moves the model to another kind
    of hardware without replacing the handle (``_hardware`` is the backend's to set).
    """

    def __init__(self, model: str, rid: str, hardware: str) -> None:
        self._model = model
        self._id = rid
        self._hardware = hardware

    @property
    def id(self) -> str:
        return self._id

    @property
    def model(self) -> str:
        return self._model

    @property
    def hardware(self) -> str:
        return self._hardware

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def _repr_fields(self) -> str:
        return f"alive={self.alive}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._id!r}, {self._repr_fields()})"


@runtime_checkable
class Backend(Protocol):
    """A serving system inferline drives. Errors are raised as ``inferline.core.errors`` types."""

    @property
    def url(self) -> str: ...

    def inventory(self) -> dict[str, int]:
        """Capacity by hardware catalog name (CPU cores for ``cpu``, devices for GPUs)."""
        ...

    def free(self) -> dict[str, int]:
        """What is not yet allocated, by hardware catalog name."""
        ...

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None: ...

    async def scale(self, model: str, replicas: int) -> None: ...

    async def remove(self, model: str) -> None: ...

    def replicas(self, model: str) -> list[ReplicaHandle]:
        """The replicas that are active now (started, healthy, not draining)."""
        ...

    def subscribe(self, callback: Callable[[str, list[ReplicaHandle]], None]) -> None:
        """Call ``callback(model, replicas(model))`` whenever a model's active set changes.

        This is how the interposed queue keeps one puller per replica without polling: a
        replica that is added (after it is ready), removed (it stops taking batches, and the
        backend waits for its in-flight batch before stopping it), dies or is restarted shows up
        as a call.
        """
        ...

    async def stats(self, model: str) -> Mapping[str, Any]: ...

    async def close(self) -> None: ...

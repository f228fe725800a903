"""Bookkeeping shared by every backend: the ``Backend.subscribe`` list and model lookup."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.errors import BackendError, NotFoundError
from inferline.core.protocols import ReplicaHandle

__all__ = ["ModelRegistry", "ReplicaSubscribers", "Subscriber"]

log = logging.getLogger(__name__)
Subscriber = Callable[[str, list[ReplicaHandle]], None]


class ReplicaSubscribers:
    """Callbacks told ``(model, active replicas)`` whenever a model's active set changes.

    A failing subscriber is logged and skipped: one broken listener must not stop the queue's
    pullers (another subscriber) from hearing about a dead replica.
    """

    def __init__(self) -> None:
        self._callbacks: list[Subscriber] = []

    def add(self, callback: Subscriber) -> None:
        self._callbacks.append(callback)

    def remove(self, callback: Subscriber) -> None:
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def notify(self, model: str, active: Sequence[ReplicaHandle]) -> None:
        for cb in list(self._callbacks):
            try:
                cb(model, list(active))
            except Exception:
                log.exception("replica-set subscriber %r failed for model %r", cb, model)

    def __len__(self) -> int:
        return len(self._callbacks)


class ModelRegistry:
    """What every backend does the same way around its models: look one up by name, tell
    subscribers about its active replicas, refuse work once closed.

    Subclasses keep ``self._models`` (name -> their own record), ``self._subscribers``
    (``ReplicaSubscribers``), ``self._closed`` and ``self._url``.
    """

    _models: dict[str, Any]
    _subscribers: ReplicaSubscribers
    _closed: bool
    _url: str

    def replicas(self, model: str) -> list[ReplicaHandle]:
        """The model's live handles (a record with ``handles``); backends with other records
        override this."""
        return [h for h in self._get(model).handles if h.alive]

    def models(self) -> list[str]:
        return list(self._models)

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.add(callback)

    def unsubscribe(self, callback: Subscriber) -> None:
        self._subscribers.remove(callback)

    def _get(self, model: str) -> Any:
        try:
            return self._models[model]
        except KeyError:
            raise NotFoundError("model", model, sorted(self._models)) from None

    def _notify(self, model: str) -> None:
        self._subscribers.notify(model, self.replicas(model) if model in self._models else [])

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(self._url, "backend is closed")

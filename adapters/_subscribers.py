"""The replica-set subscriber list every backend keeps for ``Backend.subscribe``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from inferline.core.protocols import ReplicaHandle

__all__ = ["ReplicaSubscribers", "Subscriber"]

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

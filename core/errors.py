"""The project's exceptions. Every error inferline raises on purpose derives from InferlineError.

Exceptions carry their context as attributes so callers (CLI, HTTP frontend) can render them
without parsing messages.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CapacityError",
    "DeadlineExceededError",
    "InfeasibleError",
    "InferlineError",
    "NotFoundError",
    "OverloadedError",
    "ReplicaError",
    "StorageError",
    "ValidationError",
]


class InferlineError(Exception):
    """Base class of every error inferline raises deliberately."""


class ValidationError(InferlineError, ValueError):
    """Bad input: names the field, the expected form, and what was given."""

    def __init__(self, field: str, expected: str, got: object = None) -> None:
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(f"{field}: expected {expected}, got {got!r}")


class NotFoundError(InferlineError, KeyError):
    """A named thing (model, app, user, backend scheme, ...) does not exist."""

    def __init__(self, kind: str, name: object, known: object = None) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        msg = f"unknown {kind} {name!r}"
        if known is not None:
            msg += f" (known: {known!r})"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the whole message otherwise
        return str(self.args[0])


class InfeasibleError(InferlineError):
    """No configuration in the searched space meets the SLO."""

    def __init__(self, message: str, best_latency_s: float | None = None) -> None:
        self.best_latency_s = best_latency_s
        super().__init__(message)


class CapacityError(InferlineError):
    """A placement request would oversubscribe the hardware inventory."""

    def __init__(self, message: str, free: object = None) -> None:
        self.free = free
        super().__init__(message)


class OverloadedError(InferlineError):
    """A bounded queue is full; the query was refused, not dropped."""

    def __init__(self, model: str, capacity: int) -> None:
        self.model = model
        self.capacity = capacity
        super().__init__(f"model {model!r} is overloaded: queue holds its limit of {capacity}")


class DeadlineExceededError(InferlineError):
    """The query's deadline passed before it was processed (only when expiry is enabled)."""

    def __init__(self, model: str, late_by_s: float, message: str | None = None) -> None:
        self.model = model
        self.late_by_s = late_by_s
        super().__init__(
            message or f"deadline exceeded at model {model!r} by {late_by_s * 1e3:.1f} ms"
        )


class BackendError(InferlineError):
    """A backend failed (connection lost, server error, bad response)."""

    def __init__(self, backend: str, message: str) -> None:
        self.backend = backend
        super().__init__(f"{backend}: {message}")


class ReplicaError(BackendError):
    """A single replica failed or died while processing a batch."""

    def __init__(self, backend: str, replica: str, message: str) -> None:
        self.replica = replica
        super().__init__(backend, f"replica {replica}: {message}")


class StorageError(InferlineError):
    """A durable store could not take a write (disk full, read-only, unreachable); nothing
    was acknowledged, so the client may retry (HTTP 503)."""

    def __init__(self, store: str, message: str) -> None:
        self.store = store
        super().__init__(f"store {store}: {message}")

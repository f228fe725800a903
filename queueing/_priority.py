"""Per-request priority: strict across classes, EDF within one.

A query's priority is an int from ``MIN_PRIORITY`` to ``MAX_PRIORITY``; higher is served first
(0, the default, is every query that names none). The queue orders its heap by
``(klass, deadline, ...)`` with ``klass = -priority`` (``QueuedQuery``), so a higher class
always goes first and deadlines order a class.

The request's priority reaches the queue through a context variable set around the app's
handler (``priority_scope``): an app's handler is any ``async (x, slo_s)`` function (a
pipeline, a selection policy, a plugin's), and every model call it makes, in this task or in
the tasks it gathers (they copy the context), carries the priority without each handler
passing it on. ``PipelineRunner`` reads it once per query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from inferline.core.errors import ValidationError

__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "check_priority", "current_priority", "priority_scope"]

MIN_PRIORITY = -100
MAX_PRIORITY = 100

_PRIORITY: ContextVar[int] = ContextVar("inferline_priority", default=0)

current_priority = _PRIORITY.get  # the running request's priority (0 outside a scope)


def check_priority(value: Any, field: str = "priority") -> int:
    """``value`` as a priority, or ``ValidationError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"an int from {MIN_PRIORITY} to {MAX_PRIORITY}", value)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValidationError(field, f"an int from {MIN_PRIORITY} to {MAX_PRIORITY}", value)
    return value


@contextlib.contextmanager
def priority_scope(priority: int) -> Iterator[None]:
    """Model calls made inside (and in tasks started inside) carry ``priority``."""
    token = _PRIORITY.set(check_priority(priority))
    try:
        yield
    finally:
        _PRIORITY.reset(token)

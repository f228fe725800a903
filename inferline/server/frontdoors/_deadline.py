"""Per-request deadline and priority on the protocol doors: KServe v2 ``parameters.timeout``
(microseconds, as Triton) and ``parameters.priority``, and the deadline a gRPC client set.

A request's time budget is the shortest of what it asked (``timeout``, the gRPC deadline
left) and the served name's own SLO (an app's ``slo_s``, a model's ``model_slo_s``): the
name's SLO is the default and the cap. ``priority`` is inferline's class, as on the native
route (an int from -100 to 100, higher served first, EDF within a class; ``inferline.
queueing.check_priority``), not Triton's level numbering (where 1 is the highest).
TF Serving's REST API has no per-request deadline or priority: its requests get the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferline.core import ValidationError
from inferline.queueing import check_priority

__all__ = [
    "MAX_TIMEOUT_US",
    "RequestLimits",
    "grpc_limits",
    "kserve_grpc_limits",
    "kserve_limits",
]

# An hour: anything longer is the SLO anyway, and a bigger integer is a client's mistake.
MAX_TIMEOUT_US = 3_600_000_000
_TIMEOUT = "parameters.timeout"
_PRIORITY = "parameters.priority"


@dataclass(frozen=True)
class RequestLimits:
    """What one request asked: a time budget in seconds (None: the served name's SLO) and a
    priority class (0: the default)."""

    timeout_s: float | None = None
    priority: int = 0

    def budget(self, slo_s: float) -> float:
        """The request's SLO: ``slo_s``, or shorter when it asked for less."""
        return slo_s if self.timeout_s is None else min(slo_s, self.timeout_s)

    def within(self, remaining_s: float | None) -> RequestLimits:
        """These limits, the time budget cut to ``remaining_s`` (a gRPC deadline's rest)."""
        if remaining_s is None or not math.isfinite(remaining_s):
            return self
        left = max(0.0, remaining_s)
        t = left if self.timeout_s is None else min(self.timeout_s, left)
        return RequestLimits(t, self.priority)


DEFAULT_LIMITS = RequestLimits()


def _timeout(v: Any) -> float | None:
    """``parameters.timeout``: microseconds, an integer in [0, ``MAX_TIMEOUT_US``]; 0 (as in
    Triton) means none."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TIMEOUT_US:
        raise ValidationError(_TIMEOUT, f"microseconds, an integer in [0, {MAX_TIMEOUT_US}]", v)
    return None if v == 0 else v / 1e6


def kserve_limits(params: Mapping[str, Any] | None) -> RequestLimits:
    """The limits of a KServe v2 JSON request's top-level ``parameters`` (already checked to
    be an object). Bad values: ``ValidationError`` naming ``parameters.timeout`` or
    ``parameters.priority`` (a 400)."""
    if not params or ("timeout" not in params and "priority" not in params):
        return DEFAULT_LIMITS
    t = params.get("timeout")
    p = params.get("priority")
    return RequestLimits(
        None if t is None else _timeout(t), 0 if p is None else check_priority(p, _PRIORITY)
    )


def _grpc_int(param: Any, field: str) -> int:
    """An ``InferParameter``'s integer (``int64_param``, or ``uint64_param`` as tritonclient
    sends ``priority``); another kind: ``ValidationError`` naming ``field``."""
    kind = param.WhichOneof("parameter_choice")
    if kind in ("int64_param", "uint64_param"):
        return int(getattr(param, kind))
    raise ValidationError(field, "an int64_param or uint64_param", kind)


def kserve_grpc_limits(params: Any, context: Any) -> RequestLimits:
    """The limits of a ``ModelInferRequest``: its ``parameters`` map, cut to the client's
    gRPC deadline."""
    limits = DEFAULT_LIMITS
    if "timeout" in params or "priority" in params:
        t = _timeout(_grpc_int(params["timeout"], _TIMEOUT)) if "timeout" in params else None
        p = (
            check_priority(_grpc_int(params["priority"], _PRIORITY), _PRIORITY)
            if "priority" in params
            else 0
        )
        limits = RequestLimits(t, p)
    return grpc_limits(context, limits)


def grpc_limits(context: Any, limits: RequestLimits = DEFAULT_LIMITS) -> RequestLimits:
    """``limits`` cut to what is left of the deadline the client set (none: unchanged)."""
    return limits.within(context.time_remaining())

"""The predict route's work, without FastAPI: parse a body (one ``json.loads``, no pydantic on the hot path), check inputs, run them through the ``Service``, render the answer. The ASGI-level ``PredictRoute`` and the documented FastAPI route both call ``handle_predict``.

A body may shorten the app's SLO (``latency_slo_ms``; the app's SLO is the default and the
cap) and name a ``priority`` (an int, higher served first; ``inferline.queueing``'s
``priority_scope``). A query the queue refuses as predicted late is a 429 with
``Retry-After`` (``http_answer``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferline.core import InferlineError, ValidationError, decode_json, error_body, status_for
from inferline.queueing import PredictedLate, check_priority
from inferline.server._decode import InputSpec, brief, decode_input
from inferline.server._outcomes import Prediction, json_default
from inferline.server._service import Service

__all__ = [
    "MAX_SLO_MS",
    "AppRules",
    "PredictRequest",
    "error_answer",
    "handle_predict",
    "http_answer",
    "parse_predict",
    "run_predict",
]

log = logging.getLogger(__name__)

MAX_SLO_MS = 3_600_000.0


_KEYS = {"input", "input_batch", "latency_slo_ms", "priority"}


def http_answer(e: BaseException) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """An error as the native route answers it: ``(status, body, extra headers)``. A query
    refused as predicted late is a 429 whose ``Retry-After`` (whole seconds, as HTTP has
    it) rounds its hint up; the body carries it in milliseconds too."""
    body = error_body(e)
    if isinstance(e, PredictedLate):
        body["retry_after_ms"] = round(e.retry_after_s * 1e3, 3)
        body["reason"] = e.reason
        return 429, body, {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    status = status_for(e)
    return status, body, {"Retry-After": "1"} if status == 503 else None


def _slo_of(app: Any, body: dict[str, Any]) -> float:
    """The query's SLO: the app's, or shorter when the body asks (the app's is the cap)."""
    v = body.get("latency_slo_ms")
    if v is None:
        return float(app.slo_s)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValidationError("latency_slo_ms", f"a number in (0, {MAX_SLO_MS:.0f}]", v)
    if not 0 < v <= MAX_SLO_MS:
        raise ValidationError("latency_slo_ms", f"a number in (0, {MAX_SLO_MS:.0f}]", v)
    return min(float(v) / 1e3, float(app.slo_s))


@dataclass(frozen=True)
class AppRules:
    """What the parse of a predict body needs of an app (an ``App`` has the same fields):
    its SLO (default and cap), batch limit and input spec. Door workers get them over the
    channel, so they parse and check the native route themselves."""

    name: str
    slo_s: float
    max_batch_inputs: int
    input_spec: InputSpec | None

    @classmethod
    def of(cls, app: Any) -> AppRules:
        return cls(app.name, float(app.slo_s), int(app.max_batch_inputs), app.input_spec)

    def to_dict(self) -> dict[str, Any]:
        spec = None if self.input_spec is None else self.input_spec.to_dict()
        return {
            "name": self.name,
            "slo_s": self.slo_s,
            "max_batch_inputs": self.max_batch_inputs,
            "input_spec": spec,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AppRules:
        spec = d.get("input_spec")
        return cls(
            str(d["name"]),
            float(d["slo_s"]),
            int(d["max_batch_inputs"]),
            None if spec is None else InputSpec.from_dict(spec),
        )


@dataclass(frozen=True)
class PredictRequest:
    """A parsed, checked predict body: what the queue part (``run_predict``) takes.
    ``plain``: the body held no JSON object but itself (the inputs are plain JSON)."""

    app: str
    inputs: list[Any]
    slo_s: float
    is_batch: bool
    priority: int
    plain: bool


def parse_predict(app: AppRules | Any, raw: bytes) -> PredictRequest:
    """Parse and check one predict body against ``app`` (an ``App`` or its ``AppRules``);
    ``ValidationError`` naming the field for a bad one."""
    if not raw:
        raise ValidationError("body", 'a JSON object like {"input": ...}', "an empty body")
    body = decode_json(raw, 'a JSON object like {"input": ...}')
    if not isinstance(body, dict):
        raise ValidationError("body", 'a JSON object like {"input": ...}', type(body).__name__)
    # Only JSON objects can carry tagged values ({"dtype", "b64"}, {"bytes_b64"}); a body
    # whose only "{" is its own opening needs no decoding pass over the input.
    plain = raw.count(b"{") == 1
    # A scan of the bytes (fast) spares the walk for booleans and strings over every input
    # list: with no true/false and no quotes but the keys', the inputs hold only numbers.
    non_numbers = b"true" in raw or b"false" in raw or raw.count(b'"') > 2 * len(body)
    extra = set(body) - _KEYS
    if extra:
        raise ValidationError(
            "body", "only keys input, input_batch, latency_slo_ms, priority", sorted(extra)
        )
    slo_s = _slo_of(app, body)
    priority = body.get("priority")
    priority = 0 if priority is None else check_priority(priority)
    has_one = "input" in body
    has_batch = "input_batch" in body
    if has_one == has_batch:
        raise ValidationError("body", "exactly one of 'input' or 'input_batch'", sorted(body))
    spec = app.input_spec
    if has_one:
        x = decode_input(spec, body["input"], "input", plain=plain, non_numbers=non_numbers)
        return PredictRequest(app.name, [x], slo_s, False, priority, plain)
    batch = body["input_batch"]
    if not isinstance(batch, list) or not batch:
        raise ValidationError("input_batch", "a non-empty JSON array of inputs", brief(batch))
    if len(batch) > app.max_batch_inputs:
        raise ValidationError(
            "input_batch", f"at most {app.max_batch_inputs} inputs", f"{len(batch)} inputs"
        )
    inputs = [
        decode_input(spec, x, f"input_batch[{i}]", plain=plain, non_numbers=non_numbers)
        for i, x in enumerate(batch)
    ]
    return PredictRequest(app.name, inputs, slo_s, True, priority, plain)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False, default=json_default).encode()


class _OutputNotJSON(Exception):
    pass


def _dumps_output(app_name: str, body: Any) -> bytes:
    try:
        return _dumps(body)
    except (ValueError, TypeError, InferlineError) as e:
        raise _OutputNotJSON(f"the output of app {app_name!r} has no JSON form: {e}") from None


_CLOSING = {"detail": "server is shutting down", "error": "Unavailable"}


def error_answer(e: InferlineError) -> tuple[int, bytes, dict[str, str] | None]:
    """A refused request's answer as the native route sends it."""
    status, body, headers = http_answer(e)
    return status, _dumps(body), headers


async def handle_predict(
    service: Service, app_name: str, raw: bytes
) -> tuple[int, bytes, dict[str, str] | None]:
    """One predict request, start to end: ``(status, JSON body, extra headers)``. Never raises
    for a bad request or a failed query: those become 4xx/5xx answers."""
    if service.closing:
        return 503, _dumps(_CLOSING), None
    try:
        req = parse_predict(service.app(app_name), raw)
    except InferlineError as e:
        service.metrics.rejected(app_name if app_name in service.apps else "-", "invalid")
        return error_answer(e)
    return await run_predict(service, req)


async def run_predict(
    service: Service, req: PredictRequest
) -> tuple[int, bytes, dict[str, str] | None]:
    """The queue part of a parsed request (``parse_predict``'s): its answer, as
    ``handle_predict`` gives it."""
    if service.closing:
        return 503, _dumps(_CLOSING), None
    app_name = req.app
    try:
        if not req.is_batch:
            pred = await service.predict(app_name, req.inputs[0], req.slo_s, req.priority)
            return 200, _dumps_output(app_name, pred.to_body()), None
        results = await asyncio.gather(
            *(service.predict(app_name, x, req.slo_s, req.priority) for x in req.inputs),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, InferlineError):
                raise r
        return 200, _dumps_output(app_name, {"results": [_batch_item(r) for r in results]}), None
    except _OutputNotJSON as e:
        log.error("%s", e)
        return 500, _dumps({"detail": str(e), "error": "OutputError"}), None
    except InferlineError as e:
        return error_answer(e)
    except Exception as e:  # a bug in a pipeline: answer it, log it, keep serving
        log.exception("app %r failed", app_name)
        return 500, _dumps({"detail": f"{type(e).__name__}: {e}", "error": "InternalError"}), None


def _batch_item(r: Prediction | BaseException) -> dict[str, Any]:
    if isinstance(r, Prediction):
        return r.to_body()
    status, body, _ = http_answer(r)
    return {**body, "status": status}

"""Outcome accounting: one query through an app's handler, ended in exactly one outcome.

Outcomes of one query (docs/design.md: every accepted query ends in exactly one of them):
a prediction; the app's default output with an explanation (deadline passed while
``respond_by_slo`` is set, deadline expiry in the queue, a backend failure); or an explicit
error (bad input, unknown app, overload, or a failure of an app without a default). Each is
counted once in the service's metrics, under ``ok``, ``default``, ``overloaded``,
``refused``, ``invalid`` or ``error``.

A query the queue refused as predicted late (``PredictedLate``, admission by predicted
completion) is an explicit refusal (``refused``: HTTP 429), or the app's default output with
the explanation ``predicted_late`` where the app asks for it (``on_predicted_late``). Every
refusal, a full queue's too, is also counted by reason (``inferline_refused_total``); every
prediction answered within its SLO is goodput (``inferline_goodput_total``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from inferline.core import (
    DeadlineExceededError,
    InferlineError,
    OverloadedError,
    ValidationError,
    value_to_json,
)
from inferline.queueing import PredictedLate, priority_scope
from inferline.server._apps import App

__all__ = [
    "DefaultAnswer",
    "OutcomeCounter",
    "Prediction",
    "QueryIds",
    "QueryRunner",
    "json_default",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DefaultAnswer:
    """What a pipeline returns to answer with a default of its own (e.g. a selection app's
    confidence below its threshold): the response says ``default: true`` with ``explanation``
    and ``/metrics`` counts it under ``reason``, like the app's own default output."""

    output: Any
    explanation: str
    reason: str = "pipeline"


@dataclass(frozen=True)
class Prediction:
    """What ``Service.predict`` returns for one query."""

    query_id: str
    output: Any
    default: bool = False
    default_explanation: str | None = None
    latency_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "query_id": self.query_id,
            "output": value_to_json(self.output),
            "default": self.default,
        }
        if self.default_explanation is not None:
            d["default_explanation"] = self.default_explanation
        return d

    def to_body(self) -> dict[str, Any]:
        """Like ``to_json`` but with the output as is: for ``json.dumps`` with
        ``default=json_default``, which converts only what JSON cannot hold (arrays, numpy
        scalars, bytes, errors), instead of walking every output."""
        d: dict[str, Any] = {
            "query_id": self.query_id,
            "output": self.output,
            "default": self.default,
        }
        if self.default_explanation is not None:
            d["default_explanation"] = self.default_explanation
        return d


def json_default(v: Any) -> Any:
    """``json.dumps(default=...)`` hook: the wire codec's JSON form of non-JSON values."""
    if isinstance(v, set | frozenset):
        raise TypeError(f"a {type(v).__name__} has no JSON form")
    return value_to_json(v)


class QueryIds:
    """Query ids unique across processes and restarts: pid and start time, then a counter."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}{int(time.time()) & 0xFFFFF:05x}"

    def new(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"


class OutcomeCounter(Protocol):
    """Where outcomes are counted (``ServiceMetrics``)."""

    def observe(self, app: str, latency_s: float, outcome: str) -> None: ...

    def defaults(self, app: str, reason: str) -> None: ...

    def refused(self, app: str, reason: str) -> None: ...

    def goodput(self, app: str) -> None: ...


class QueryRunner:
    """Runs one (already checked) input through an app's handler, bounded by its wait, and
    turns what happened into a ``Prediction`` (possibly the default) or an explicit error,
    counting the outcome once."""

    def __init__(self, counter: OutcomeCounter, clock: Callable[[], float], ids: QueryIds) -> None:
        self._counter = counter
        self._clock = clock
        self._ids = ids

    async def run(
        self, app: App, x: Any, slo_s: float | None = None, priority: int = 0
    ) -> Prediction:
        slo = app.slo_s if slo_s is None else slo_s
        qid = self._ids.new()
        t0 = self._clock()
        wait = min(slo, app.max_wait_s) if app.respond_by_slo else app.max_wait_s
        try:
            # asyncio.timeout, not wait_for: no extra task per query on the hot path
            async with asyncio.timeout(wait):
                if priority:
                    with priority_scope(priority):  # the model calls carry its class
                        out = await app.handler(x, slo)
                else:
                    out = await app.handler(x, slo)
        except BaseException as e:
            return self._failed(app, qid, t0, e, slo, wait)
        return self._answered(app, qid, t0, out, slo)

    def _failed(
        self, app: App, qid: str, t0: float, e: BaseException, slo: float, wait: float
    ) -> Prediction:
        """The handler raised: the default where the app has one and ``e`` allows it, else
        the error (a timeout becomes a 504's ``DeadlineExceededError``)."""
        if isinstance(e, TimeoutError):
            why = f"no prediction within {wait * 1e3:.0f} ms (SLO {slo * 1e3:.0f} ms)"
            if app.has_default:
                return self._default(app, qid, t0, why, "timeout")
            elapsed = self._clock() - t0
            err = DeadlineExceededError(app.name, elapsed - slo, f"app {app.name!r}: {why}")
            self._counter.observe(app.name, self._clock() - t0, "error")  # a 504, not a default
            raise err from None
        if isinstance(e, PredictedLate):
            return self._refused(app, qid, t0, e)
        if isinstance(e, OverloadedError):
            self._counter.refused(app.name, "queue_full")
            self._raise(app, t0, e, "overloaded")
        if isinstance(e, ValidationError):
            self._raise(app, t0, e, "invalid")
        if isinstance(e, InferlineError) and app.has_default:  # BackendError is one too
            if isinstance(e, DeadlineExceededError):
                return self._default(app, qid, t0, str(e), "deadline")
            log.warning("app %r: answering default output: %s", app.name, e)
            return self._default(app, qid, t0, f"{type(e).__name__}: {e}", "error")
        self._raise(app, t0, e, "error")

    def _refused(self, app: App, qid: str, t0: float, e: PredictedLate) -> Prediction:
        """Refused as predicted late: the default output where the app asks for it, else
        the refusal itself (a 429)."""
        self._counter.refused(app.name, e.reason)
        if app.on_predicted_late == "default":
            return self._default(app, qid, t0, f"predicted_late: {e}", "predicted_late")
        self._raise(app, t0, e, "refused")

    def _answered(self, app: App, qid: str, t0: float, out: Any, slo: float) -> Prediction:
        """The handler returned ``out``: a prediction, a default of the pipeline's own, or an
        error value (a model answered this one input with an error)."""
        if isinstance(out, PredictedLate):
            return self._refused(app, qid, t0, out)
        if isinstance(out, OverloadedError | ValidationError):
            self._raise(app, t0, out, "error")
        if isinstance(out, DefaultAnswer):
            lat = self._clock() - t0
            self._counter.observe(app.name, lat, "default")
            self._counter.defaults(app.name, out.reason)
            return Prediction(qid, out.output, True, out.explanation, lat)
        if isinstance(out, BaseException):
            if not app.has_default:
                self._raise(app, t0, out, "error")
            return self._default(app, qid, t0, f"{type(out).__name__}: {out}", "error")
        lat = self._clock() - t0
        self._counter.observe(app.name, lat, "ok")
        if lat <= slo:
            self._counter.goodput(app.name)
        return Prediction(qid, out, False, None, lat)

    def _raise(self, app: App, t0: float, e: BaseException, outcome: str) -> NoReturn:
        self._counter.observe(app.name, self._clock() - t0, outcome)
        raise e

    def _default(self, app: App, qid: str, t0: float, why: str, kind: str) -> Prediction:
        lat = self._clock() - t0
        self._counter.observe(app.name, lat, "default")
        self._counter.defaults(app.name, kind)
        return Prediction(qid, app.default_output, True, why, lat)

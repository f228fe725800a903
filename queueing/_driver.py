"""The pipeline driver: run ``async def pipeline(x, ctx)`` against the dispatcher.

A pipeline is ordinary async Python that calls ``await ctx.predict("model", value)``. Calls
are awaitables, so ``asyncio.gather(ctx.predict("a", x), ctx.predict("b", x))`` runs two
branches in parallel. Every model call of one query carries the query's deadline (pipeline
arrival + SLO), which orders it in each model's EDF queue, so the whole pipeline is scheduled
by the end-to-end deadline as the estimator assumes.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferline.core.errors import ValidationError

from ._dispatcher import Dispatcher
from ._priority import current_priority

if TYPE_CHECKING:
    from ._cache import PredictionCache
    from ._instant import Handoff

__all__ = ["PipelineContext", "PipelineFn", "PipelineRunner", "QueryResult"]

log = logging.getLogger(__name__)


class PipelineContext:
    """What a pipeline function sees: the query's id, arrival, deadline and ``predict``.

    ``calls`` counts the model calls made so far (the frontend reports it).
    """

    __slots__ = ("_call", "_handoff", "arrival", "calls", "deadline", "priority", "query_id")

    def __init__(
        self,
        query_id: int,
        arrival: float,
        deadline: float,
        call: Callable[[str, Any, PipelineContext], Awaitable[Any]],
        priority: int = 0,
    ) -> None:
        self.query_id = query_id
        self.priority = priority  # its class in every model's queue (``_priority``)
        self.arrival = arrival
        self.deadline = deadline
        self.calls = 0
        self._call = call
        # set while PipelineRunner.run drives the query: tells the dispatcher's same-instant
        # barrier when the query is between two model calls (see ``_instant``)
        self._handoff: Handoff | None = None

    async def predict(self, model: str, x: Any) -> Any:
        """The output of ``model`` on ``x`` (raises the query's error, e.g. overload)."""
        self.calls += 1
        h = self._handoff
        if h is None:
            return await self._call(model, x, self)
        h.call()
        try:
            return await self._call(model, x, self)
        finally:
            h.answered()

    def __repr__(self) -> str:
        return (
            f"PipelineContext(query_id={self.query_id}, arrival={self.arrival}, "
            f"deadline={self.deadline}, calls={self.calls})"
        )


PipelineFn = Callable[[Any, PipelineContext], Awaitable[Any]]


@dataclass(frozen=True)
class QueryResult:
    """One finished query: its output, timing (dispatcher clock) and number of model calls."""

    query_id: int
    output: Any
    arrival: float
    deadline: float
    finish: float
    calls: int

    @property
    def latency_s(self) -> float:
        return self.finish - self.arrival

    @property
    def met_deadline(self) -> bool:
        return self.finish <= self.deadline


class PipelineRunner:
    """Runs a pipeline function for each query through ``dispatcher``.

    ``cache`` (a ``PredictionCache``) makes identical model calls share one evaluation and
    serves repeats from memory; keys use ``versions[model]`` (default ``"1"``). Inputs that
    the cache cannot key (arbitrary objects) bypass it.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        fn: PipelineFn,
        *,
        slo_s: float,
        cache: PredictionCache | None = None,
        versions: dict[str, str | int] | None = None,
    ) -> None:
        if not callable(fn):
            raise ValidationError("fn", "an async function (x, ctx)", fn)
        self._check_slo(slo_s)
        self.dispatcher = dispatcher
        self.fn = fn
        self.slo_s = float(slo_s)
        self.cache = cache
        self.versions = dict(versions or {})
        self._ids = itertools.count(1)
        self._call = self._cached_call if cache is not None else self._plain_call

    @staticmethod
    def _check_slo(slo_s: Any) -> None:
        if isinstance(slo_s, bool) or not isinstance(slo_s, int | float) or not slo_s > 0:
            raise ValidationError("slo_s", "a number of seconds > 0", slo_s)

    async def _plain_call(self, model: str, x: Any, ctx: PipelineContext) -> Any:
        return await self.dispatcher.submit_nowait(
            model, x, ctx.deadline, ctx.arrival, ctx.query_id, ctx._handoff, ctx.priority
        )

    async def _cached_call(self, model: str, x: Any, ctx: PipelineContext) -> Any:
        assert self.cache is not None
        from ._cache import cache_key  # the cache is optional; import it only when used

        model = self.dispatcher.resolve(model)  # the variant serving a stage keys its outputs
        try:
            key = cache_key(model, self.versions.get(model, "1"), x)
        except ValidationError:
            return await self._plain_call(model, x, ctx)
        return await self.cache.get_or_compute(key, lambda: self._plain_call(model, x, ctx))

    def context(
        self, *, arrival: float | None = None, slo_s: float | None = None
    ) -> PipelineContext:
        """A fresh context for one query (``run`` makes one; exposed for custom drivers)."""
        if slo_s is not None:
            self._check_slo(slo_s)
        t = self.dispatcher.clock() if arrival is None else float(arrival)
        if not math.isfinite(t):
            raise ValidationError("arrival", "a finite clock time", arrival)
        slo = self.slo_s if slo_s is None else float(slo_s)
        # the request's priority (``priority_scope`` around the app's handler), read once
        return PipelineContext(next(self._ids), t, t + slo, self._call, current_priority())

    async def run(self, x: Any, *, arrival: float | None = None, slo_s: float | None = None) -> Any:
        """The pipeline's output for ``x``; ``arrival`` defaults to now, ``slo_s`` to the
        runner's SLO. Errors of model calls propagate unless the pipeline catches them."""
        ctx = self.context(arrival=arrival, slo_s=slo_s)
        # The query's hand-off is open from its arrival to its end: while it is between two
        # model calls, pullers wait before cutting batches (the estimator's rule 3). Inline,
        # not a helper coroutine: one frame less per query.
        h = ctx._handoff = self.dispatcher.open_handoff()
        try:
            return await self.fn(x, ctx)
        finally:
            h.close()

    async def run_detailed(
        self, x: Any, *, arrival: float | None = None, slo_s: float | None = None
    ) -> QueryResult:
        """Like ``run`` but with the query id, timing and number of model calls."""
        ctx = self.context(arrival=arrival, slo_s=slo_s)
        h = ctx._handoff = self.dispatcher.open_handoff()  # as in ``run``
        try:
            out = await self.fn(x, ctx)
        finally:
            h.close()
        return QueryResult(
            ctx.query_id, out, ctx.arrival, ctx.deadline, self.dispatcher.clock(), ctx.calls
        )

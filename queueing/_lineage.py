"""Profiling mode of the driver: derive the pipeline DAG from the pipeline function.

InferLine's profiler runs the driver program on sample queries and traces each query's
lineage through the model calls; the union of the lineage graphs is the pipeline graph and the
fraction of queries that visit a model is its scale factor (InferLine §3.2). Here:

- Model B depends on model A within one query if B's call started after A's result was
  returned *in the causal sense* (happens-before), not merely earlier on the clock: calls
  launched together with ``asyncio.gather`` do not depend on each other even if one finishes
  first. Causality is tracked per asyncio task with a context variable: a task starts knowing
  what its parent knew when the task made its first call, learns each call it awaits, and a
  parent learns everything a finished child task knew (``gather`` joins its children before
  the parent continues).
- Each query's dependency graph is transitively reduced, then the queries' graphs are united.
  Reducing per query (not the union) keeps an edge A->C that a query takes when it skips a
  conditional B between them, as the pipeline format needs (a query visits a model only if it
  visited one of its parents).
- Models appear in first-seen order; the scale factor of a model is the fraction of sample
  queries that called it at least once, and its ``visits`` the mean number of calls those
  queries made to it (recorded where it is not 1: a pipeline that calls a model k times per
  query puts k queue entries on it, so it needs k times the throughput).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from inferline.core import Pipeline
from inferline.core.errors import ValidationError

from ._dispatcher import Dispatcher
from ._driver import PipelineContext, PipelineFn

__all__ = ["TracingContext", "trace_pipeline"]

ModelCall = Callable[[str, Any], Awaitable[Any]]


class _Node:
    """Causal knowledge of one asyncio task within one traced query."""

    __slots__ = ("children", "known", "task")

    def __init__(self, task: asyncio.Task[Any] | None, known: frozenset[int]) -> None:
        self.task = task
        self.known = known
        self.children: list[_Node] = []

    def absorb_finished(self) -> None:
        keep: list[_Node] = []
        for c in self.children:
            if c.task is not None and c.task.done():
                c.absorb_finished()  # grandchildren that never reported back
                self.known = self.known | c.known
            else:
                keep.append(c)
        self.children = keep


class TracingContext(PipelineContext):
    """A pipeline context that records each call's model and causal predecessors."""

    __slots__ = ("_calls", "_model_call", "_var")

    def __init__(self, query_id: int, call: ModelCall) -> None:
        super().__init__(query_id, 0.0, math.inf, self._traced)
        self._model_call = call
        self._calls: list[tuple[str, frozenset[int]]] = []  # (model, call ids before it)
        self._var: contextvars.ContextVar[_Node] = contextvars.ContextVar(f"lineage{query_id}")

    async def run(self, fn: PipelineFn, x: Any) -> Any:
        """Run one query; call it in a task of its own (the root of the query's lineage)."""
        self._var.set(_Node(asyncio.current_task(), frozenset()))
        return await fn(x, self)

    def _node(self) -> _Node:
        task = asyncio.current_task()
        node = self._var.get(None)
        if node is None:
            raise ValidationError("ctx", "a TracingContext used inside TracingContext.run", None)
        if node.task is not task:  # first call in a new task: fork from the creator
            node.absorb_finished()
            child = _Node(task, node.known)
            node.children.append(child)
            self._var.set(child)
            node = child
        node.absorb_finished()
        return node

    async def _traced(self, model: str, x: Any, ctx: PipelineContext) -> Any:
        node = self._node()
        call_id = len(self._calls)
        self._calls.append((model, node.known))
        out = await self._model_call(model, x)
        node.known = node.known | {call_id}
        return out

    def call_counts(self) -> dict[str, int]:
        """Calls this query made to each model."""
        out: dict[str, int] = {}
        for m, _ in self._calls:
            out[m] = out.get(m, 0) + 1
        return out

    def lineage(self) -> tuple[list[str], set[tuple[str, str]]]:
        """Models called (first-seen order) and this query's reduced dependency edges."""
        models = list(dict.fromkeys(m for m, _ in self._calls))
        deps: dict[str, set[str]] = {m: set() for m in models}
        for m, before in self._calls:
            deps[m] |= {self._calls[i][0] for i in before if self._calls[i][0] != m}
        return models, _reduce(deps)


def _reduce(deps: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Transitive reduction of ``{child: parents}``; raises on a cycle."""
    memo: dict[str, frozenset[str]] = {}

    def ancestors(m: str, stack: tuple[str, ...]) -> frozenset[str]:
        if m in memo:
            return memo[m]
        if m in stack:
            cyc = [*stack[stack.index(m) :], m]
            raise ValidationError(
                "pipeline", "calls that form a DAG", f"cycle {' -> '.join(reversed(cyc))}"
            )
        out: set[str] = set()
        for p in deps[m]:
            out.add(p)
            out |= ancestors(p, (*stack, m))
        memo[m] = frozenset(out)
        return memo[m]

    edges: set[tuple[str, str]] = set()
    for m, ps in deps.items():
        for p in ps:
            # p -> m is implied if another parent q of m has p as an ancestor
            if not any(p in ancestors(q, (m,)) for q in ps if q != p):
                edges.add((p, m))
    return edges


async def trace_pipeline(
    fn: PipelineFn,
    sample_inputs: Iterable[Any],
    name: str,
    *,
    call: ModelCall | Dispatcher,
) -> Pipeline:
    """Run ``fn`` on each sample input with a tracing context; return the pipeline DAG.

    ``call(model, x)`` evaluates a model during tracing: any async function (for example one
    that calls the real models directly), or a ``Dispatcher`` whose models serve the calls
    (without a deadline). Queries run one after another. Raises ``ValidationError`` when no
    query called a model, or the calls form a cycle.
    """
    if isinstance(call, Dispatcher):
        d = call

        async def through(model: str, x: Any) -> Any:
            return await d.submit(model, x, deadline=math.inf)

        model_call: ModelCall = through
    elif callable(call):
        model_call = call
    else:
        raise ValidationError("call", "an async function (model, x) or a Dispatcher", call)
    order: dict[str, None] = {}
    visits: dict[str, int] = {}
    calls: dict[str, int] = {}
    edges: dict[tuple[str, str], None] = {}
    n = 0
    for i, x in zip(itertools.count(1), sample_inputs, strict=False):
        ctx = TracingContext(i, model_call)
        await asyncio.ensure_future(ctx.run(fn, x))
        n += 1
        models, es = ctx.lineage()
        for m in models:
            order.setdefault(m)
            visits[m] = visits.get(m, 0) + 1
        for m, k in ctx.call_counts().items():
            calls[m] = calls.get(m, 0) + k
        for e in sorted(es):
            edges.setdefault(e)
    if not order:
        raise ValidationError("sample_inputs", "inputs for which the pipeline calls a model", n)
    models = list(order)
    pos = {m: j for j, m in enumerate(models)}
    scale = {m: visits[m] / n for m in models if visits[m] < n}
    repeats = {m: calls[m] / visits[m] for m in models if calls[m] > visits[m]}
    return Pipeline(
        name,
        tuple(models),
        tuple(sorted(edges, key=lambda e: (pos[e[1]], pos[e[0]]))),
        scale,
        repeats,
    )

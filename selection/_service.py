"""Selection at serving time: contextual state, straggler mitigation, confidence, feedback.

``SelectionService`` binds a policy to a state store. For each query it loads the state of the
query's context (application, or application + user), asks the policy which models to query,
calls them concurrently, and at the deadline combines whatever arrived (Clipper's best-effort
straggler mitigation): missing predictions lower the confidence and the response says how many
models contributed. Below the application's confidence threshold the default output is returned
with an explanation. Predictions are kept in a bounded log so feedback (by query id, or by input)
can be joined to them and fed to ``observe``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core.errors import NotFoundError, ValidationError

from ._policy import Combined, SelectionPolicy
from ._store import MemoryStore, StateStore

__all__ = ["Prediction", "SelectionConfig", "SelectionService", "input_digest"]

log = logging.getLogger(__name__)
CallModel = Callable[[str, Any], Awaitable[Any]]


def input_digest(x: Any) -> str:
    """Stable digest of an input, so feedback can name the input instead of the query id."""
    h = hashlib.sha256()
    if isinstance(x, np.ndarray):
        h.update(str(x.dtype).encode() + str(x.shape).encode() + np.ascontiguousarray(x).tobytes())
    elif isinstance(x, bytes):
        h.update(b"b" + x)
    else:
        h.update(json.dumps(x, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class SelectionConfig:
    """Per-application selection settings."""

    confidence_threshold: float = 0.0
    default_output: Any = None
    per_user: bool = False
    log_capacity: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise ValidationError(
                "confidence_threshold", "a number in [0, 1]", self.confidence_threshold
            )
        if self.log_capacity < 1:
            raise ValidationError("log_capacity", "an integer >= 1", self.log_capacity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "confidence_threshold": self.confidence_threshold,
            "default_output": self.default_output,
            "per_user": self.per_user,
            "log_capacity": self.log_capacity,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SelectionConfig:
        return cls(
            **{
                k: d[k]
                for k in ("confidence_threshold", "default_output", "per_user", "log_capacity")
                if k in d
            }
        )


@dataclass(frozen=True)
class Prediction:
    query_id: str
    output: Any
    confidence: float
    contributed: int
    selected: int
    default: bool = False
    default_explanation: str | None = None
    models: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "query_id": self.query_id,
            "output": self.output,
            "confidence": self.confidence,
            "models_contributed": self.contributed,
            "models_selected": self.selected,
            "default": self.default,
        }
        if self.default_explanation is not None:
            d["default_explanation"] = self.default_explanation
        return d


@dataclass
class _Logged:
    context: str
    x: Any
    predictions: dict[str, Any]
    # (label, answer) once feedback for the query is applied: a retried feedback must not
    # count twice
    feedback: tuple[Any, dict[str, Any]] | None = None


def _same_label(a: Any, b: Any) -> bool:
    # labels may be lists or arrays, where == is not a plain bool
    def key(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=repr)

    return key(a) == key(b)


class SelectionService:
    """One application's selection policy, its context states and its feedback loop."""

    def __init__(
        self,
        app: str,
        policy: SelectionPolicy,
        call: CallModel | None,
        *,
        config: SelectionConfig = SelectionConfig(),
        store: StateStore | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self.call = call
        self.config = config
        self.store: StateStore = store if store is not None else MemoryStore()
        self._clock = clock  # default: the running event loop's clock
        self._log: OrderedDict[str, _Logged] = OrderedDict()
        self._by_input: dict[str, str] = {}

    # -- state --------------------------------------------------------------------------
    def context_key(self, user: str | None) -> str:
        if self.config.per_user and user is not None:
            return f"{self.app}/user/{user}"
        return f"{self.app}/global"

    def state(self, user: str | None = None) -> Any:
        raw = self.store.get(self.context_key(user))
        return self.policy.state_from_dict(raw) if raw is not None else self.policy.init()

    # -- serving ------------------------------------------------------------------------
    async def predict(
        self,
        x: Any,
        *,
        deadline: float | None = None,
        user: str | None = None,
        query_id: str | None = None,
        call: CallModel | None = None,
    ) -> Prediction:
        """Query the selected models; at ``deadline`` (the service's clock, by default the
        event loop's) combine what has arrived. ``call`` replaces the service's model call for
        this query (e.g. a pipeline context's ``predict``, which carries the query's deadline
        into the queue)."""
        qid = query_id or uuid.uuid4().hex
        ctx = self.context_key(user)
        state = self.state(user)
        chosen = list(self.policy.select(state, x))
        fn = call if call is not None else self.call
        if fn is None:
            raise ValidationError("call", "a model call (async (model, x) -> output)", None)
        tasks = {m: asyncio.ensure_future(fn(m, x)) for m in chosen}
        now = self._clock() if self._clock is not None else asyncio.get_running_loop().time()
        timeout = None if deadline is None else max(0.0, deadline - now)
        done, pending = await asyncio.wait(tasks.values(), timeout=timeout)
        for t in pending:
            t.cancel()
        preds: dict[str, Any] = {}
        failed: list[str] = []
        for m, t in tasks.items():
            if t in done:
                if t.cancelled():  # by the call itself (e.g. an RPC cancelled under it)
                    failed.append(f"{m}: cancelled")
                elif t.exception() is None:
                    preds[m] = t.result()
                else:
                    failed.append(f"{m}: {t.exception()}")
        combined: Combined = self.policy.combine(state, x, preds)
        self._remember(qid, ctx, x, preds)
        default, why = False, None
        if not preds:
            default, why = (
                True,
                "no model answered before the deadline"
                + (f" ({'; '.join(failed)})" if failed else ""),
            )
        elif combined.confidence < self.config.confidence_threshold:
            default = True
            why = (
                f"confidence {combined.confidence:.2f} below the threshold "
                f"{self.config.confidence_threshold:.2f} ({combined.contributed} of {combined.selected} models answered)"
            )
        out = self.config.default_output if default else combined.output
        return Prediction(
            qid,
            out,
            combined.confidence,
            combined.contributed,
            combined.selected,
            default,
            why,
            tuple(preds),
        )

    def _remember(self, qid: str, ctx: str, x: Any, preds: dict[str, Any]) -> None:
        self._log[qid] = _Logged(ctx, x, preds)
        self._by_input[input_digest(x)] = qid
        while len(self._log) > self.config.log_capacity:
            old, entry = self._log.popitem(last=False)
            d = input_digest(entry.x)
            if self._by_input.get(d) == old:
                del self._by_input[d]

    # -- feedback -----------------------------------------------------------------------
    def feedback(
        self, label: Any, *, query_id: str | None = None, x: Any = None, user: str | None = None
    ) -> dict[str, Any]:
        """Join feedback to the logged predictions of a query and update the context state.

        The update is a read-modify-write in the store, so with a durable store the feedback is
        persisted once this returns. Feedback counts once per query: the same label again (a
        client's retry) returns the first answer with ``"duplicate": true`` and changes
        nothing; another label is refused.
        """
        if query_id is None and x is None:
            raise ValidationError("query_id", "a query id or the input the feedback is about", None)
        if query_id is None:
            query_id = self._by_input.get(input_digest(x))
            if query_id is None:
                raise NotFoundError("logged prediction for input", input_digest(x))
        entry = self._log.get(query_id)
        if entry is None:
            raise NotFoundError("query id (not in the recent-predictions log)", query_id)
        if entry.feedback is not None:
            first, answer = entry.feedback
            if _same_label(first, label):
                return {**answer, "duplicate": True}
            raise ValidationError(
                "label",
                f"the label already recorded for query {query_id!r} ({first!r}); "
                "feedback counts once per query",
                label,
            )
        ctx = entry.context if user is None else self.context_key(user)

        def apply(raw: dict[str, Any] | None) -> Mapping[str, Any]:
            st = self.policy.state_from_dict(raw) if raw is not None else self.policy.init()
            return self.policy.observe(st, entry.x, label, entry.predictions).to_dict()

        new = self.store.update(ctx, apply)
        answer = {
            "query_id": query_id,
            "context": ctx,
            "models_observed": sorted(entry.predictions),
            "steps": new.get("steps"),
        }
        entry.feedback = (label, answer)
        return answer

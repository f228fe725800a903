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
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core.errors import NotFoundError, ValidationError

from ._policy import MISSING, Combined, SelectionPolicy, as_label
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
    selected: tuple[str, ...] = ()
    # the policy's selection probabilities when the query was made (Exp3's importance weight)
    selected_p: dict[str, float] | None = None
    # (label, answer) once feedback for the query is applied: a retried feedback must not
    # count twice
    feedback: tuple[Any, dict[str, Any]] | None = None


def _same_label(a: Any, b: Any) -> bool:
    # labels may be lists or arrays, where == is not a plain bool; 1 and 1.0 are one label
    def key(v: Any) -> str:
        if isinstance(v, int | float) and not isinstance(v, bool):
            v = float(v)
        return json.dumps(v, sort_keys=True, default=repr)

    return key(a) == key(b)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.number) and not isinstance(v, bool | np.bool_)


def _check_label_kind(label: Any, predictions: Mapping[str, Any]) -> None:
    """A text label for models that answer numbers (or the reverse) would count as every
    model's mistake: refuse it, naming what the models answer."""
    kinds = {_is_number(as_label(y)) for y in predictions.values()}
    outs = {type(as_label(y)) for y in predictions.values()}
    if kinds == {True} and isinstance(label, str):
        raise ValidationError("label", 'a number, as the models answer (e.g. 2, not "2")', label)
    if outs and all(t is str for t in outs) and _is_number(label):
        raise ValidationError("label", "a string, as the models answer", label)


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
        self._feedback_lock = threading.Lock()
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
        probs = getattr(self.policy, "selection_probabilities", None)
        self._remember(qid, _Logged(ctx, x, preds, tuple(chosen), probs(state) if probs else None))
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

    def _remember(self, qid: str, entry: _Logged) -> None:
        self._log[qid] = entry
        self._by_input[input_digest(entry.x)] = qid
        while len(self._log) > self.config.log_capacity:
            old, entry = self._log.popitem(last=False)
            d = input_digest(entry.x)
            if self._by_input.get(d) == old:
                del self._by_input[d]

    # -- feedback -----------------------------------------------------------------------
    def feedback(
        self, label: Any, *, query_id: str | None = None, x: Any = None, user: str | None = None
    ) -> dict[str, Any]:
        # Callers may run this in a thread (a durable store's fsync must not stall the event
        # loop): one at a time, so "once per query" holds.
        with self._feedback_lock:
            return self._feedback(label, query_id, x, user)

    def _feedback(
        self, label: Any, query_id: str | None, x: Any, user: str | None
    ) -> dict[str, Any]:
        """Join feedback to the logged predictions of a query and update the context state.

        The update is a read-modify-write in the store, so with a durable store the feedback is
        persisted once this returns. Feedback counts once per query: the same label again (a
        client's retry) returns the first answer with ``"duplicate": true`` and changes
        nothing; another label is refused. The store keeps a receipt of each feedback in the
        same transaction, so this holds after a restart too, when the query log (memory) is
        gone: a 404 then means the feedback did not count.
        """
        if query_id is None and x is None:
            raise ValidationError("query_id", "a query id or the input the feedback is about", None)
        digest = input_digest(x) if query_id is None else None
        if digest is not None:
            query_id = self._by_input.get(digest)
            if query_id is None:
                dup = self._receipted(f"{self.app}/receipt-input/{digest}", label, digest)
                if dup is not None:
                    return dup
                raise NotFoundError("logged prediction for input", digest)
        assert query_id is not None
        entry = self._log.get(query_id)
        if entry is None:
            dup = self._receipted(f"{self.app}/receipt/{query_id}", label, query_id)
            if dup is not None:
                return dup
            raise NotFoundError("query id (not in the recent-predictions log)", query_id)
        if entry.feedback is not None:
            first, answer = entry.feedback
            return self._duplicate(first, answer, label, query_id)
        ctx = self._feedback_context(entry, user)
        _check_label_kind(label, entry.predictions)
        if getattr(self.policy, "observes_missing", False):
            # a selected model that did not answer loses too (else it becomes the favourite)
            preds = {m: entry.predictions.get(m, MISSING) for m in entry.selected}
            preds.update(entry.predictions)
            extra: dict[str, Any] = {"selected_p": entry.selected_p}
        else:
            preds, extra = entry.predictions, {}

        def apply(raw: dict[str, Any] | None) -> Mapping[str, Any]:
            st = self.policy.state_from_dict(raw) if raw is not None else self.policy.init()
            return self.policy.observe(st, entry.x, label, preds, **extra).to_dict()

        def answer_for(new: Mapping[str, Any]) -> dict[str, Any]:
            return {
                "query_id": query_id,
                "context": ctx,
                "models_observed": sorted(entry.predictions),
                "steps": new.get("steps"),
            }

        rkeys = [f"{self.app}/receipt/{query_id}"]
        if len(rkeys[0]) > 512:  # a client's id too long for a store key: no receipt
            rkeys = []
        rkeys.append(f"{self.app}/receipt-input/{input_digest(entry.x)}")
        if hasattr(self.store, "receipt"):  # a store of one's own may lack receipts
            new = self.store.update(  # type: ignore[call-arg]
                ctx, apply, receipt=(rkeys, lambda n: {"label": label, "answer": answer_for(n)})
            )
        else:
            new = self.store.update(ctx, apply)
        answer = answer_for(new)
        entry.feedback = (label, answer)
        return answer

    def _feedback_context(self, entry: _Logged, user: str | None) -> str:
        """The query's context; ``user`` may name it, or personalize a query made without a
        user, but not move another user's query."""
        if user is None:
            return entry.context
        ctx = self.context_key(user)
        if ctx != entry.context and entry.context != self.context_key(None):
            raise ValidationError(
                "user",
                f"the user the query was made for (context {entry.context!r}), or none",
                user,
            )
        return ctx

    def _receipted(self, rkey: str, label: Any, name: str) -> dict[str, Any] | None:
        """The duplicate answer if the store has a receipt under ``rkey`` (counted before)."""
        get = getattr(self.store, "receipt", None)
        if get is None or len(rkey) > 512:
            return None
        rec = get(rkey)
        return None if rec is None else self._duplicate(rec["label"], rec["answer"], label, name)

    @staticmethod
    def _duplicate(first: Any, answer: dict[str, Any], label: Any, name: str) -> dict[str, Any]:
        if _same_label(first, label):
            return {**answer, "duplicate": True}
        raise ValidationError(
            "label",
            f"the label already recorded for query {name!r} ({first!r}); "
            "feedback counts once per query",
            label,
        )

"""The Clipper selection-policy interface and the shared state/prediction helpers.

A policy is a pure decision object (Clipper, Listing 3.2): ``init() -> state``,
``select(state, x) -> model ids``, ``combine(state, x, predictions) -> (output, confidence)``,
``observe(state, x, feedback, predictions) -> state``. The state is isolated from the policy and
serializable (``state.to_dict()`` / ``policy.state_from_dict``) so one policy object can serve
one state per application, per user or per session (contextualization). Randomness comes from a
``random.Random`` injected at construction, never from the global generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from inferline.core.errors import ValidationError

__all__ = [
    "MISSING",
    "Combined",
    "Loss",
    "SelectionPolicy",
    "WeightState",
    "as_label",
    "combine_votes",
    "zero_one_loss",
]

Loss = Callable[[Any, Any], float]


class _Missing:
    """The prediction of a selected model that did not answer by the deadline (or failed)."""

    def __repr__(self) -> str:
        return "MISSING"


# Passed to ``observe`` of policies with ``observes_missing = True`` (the built-ins): a model
# that never answers must lose weight, or the others' losses would make it the favourite.
MISSING: Any = _Missing()


def as_label(y: Any) -> Hashable:
    """Reduce a prediction to a comparable label: argmax of a score vector, else the value."""
    if isinstance(y, np.ndarray):
        return int(np.argmax(y)) if y.size > 1 else y.item()
    if isinstance(y, list | tuple) and y and all(isinstance(v, int | float) for v in y):
        return int(np.argmax(y)) if len(y) > 1 else y[0]
    if isinstance(y, np.generic):
        return y.item()
    return y  # type: ignore[no-any-return]


def zero_one_loss(y: Any, y_hat: Any) -> float:
    """Classification loss in [0, 1] (what Clipper's Exp3/Exp4 are fed in its evaluation)."""
    return 0.0 if as_label(y) == as_label(y_hat) else 1.0


@dataclass(frozen=True)
class Combined:
    """The combined output, its confidence in [0, 1], and how many models contributed."""

    output: Any
    confidence: float
    contributed: int
    selected: int


@dataclass(frozen=True)
class WeightState:
    """Per-model log-weights plus counters; the state of every built-in policy."""

    models: tuple[str, ...]
    log_weights: tuple[float, ...]
    counts: tuple[int, ...]
    total_loss: tuple[float, ...]
    steps: int = 0

    def weights(self) -> np.ndarray:
        lw = np.asarray(self.log_weights, dtype=float)
        w = np.exp(lw - lw.max())
        return w / w.sum()

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": list(self.models),
            "log_weights": list(self.log_weights),
            "counts": list(self.counts),
            "total_loss": list(self.total_loss),
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WeightState:
        try:
            models = tuple(str(m) for m in d["models"])
            lw = tuple(float(v) for v in d["log_weights"])
            counts = tuple(int(v) for v in d["counts"])
            tl = tuple(float(v) for v in d["total_loss"])
            steps = int(d.get("steps", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError("state", "a policy state object", str(e)) from None
        if not (len(models) == len(lw) == len(counts) == len(tl)):
            raise ValidationError("state", "equal-length per-model lists", d)
        return cls(models, lw, counts, tl, steps)

    @classmethod
    def fresh(cls, models: Sequence[str]) -> WeightState:
        k = len(models)
        return cls(tuple(models), (0.0,) * k, (0,) * k, (0.0,) * k, 0)

    def index(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            raise ValidationError("model", f"one of {list(self.models)!r}", model) from None


def combine_votes(
    predictions: Mapping[str, Any], weights: Mapping[str, float], selected: Sequence[str]
) -> Combined:
    """Weighted vote over the predictions that arrived.

    Confidence is the fraction of the *selected* models that agree with the winner, so a
    missing (straggling) model lowers confidence as Clipper's straggler mitigation describes.
    """
    if not predictions:
        return Combined(None, 0.0, 0, len(selected))
    score: dict[Hashable, float] = {}
    for m, y in predictions.items():
        lab = as_label(y)
        # the tiny constant makes an all-zero-weight vote a plain majority vote
        score[lab] = score.get(lab, 0.0) + weights.get(m, 0.0) + 1e-12
    best = max(score, key=score.__getitem__)  # ties: first label seen (dicts keep order)
    agree = sum(1 for y in predictions.values() if as_label(y) == best)
    denom = max(len(selected), len(predictions))
    return Combined(best, agree / denom, len(predictions), len(selected))


@runtime_checkable
class SelectionPolicy(Protocol):
    """Clipper's selection-policy interface (state isolated and serializable)."""

    name: str
    models: tuple[str, ...]

    def init(self) -> Any: ...

    def select(self, state: Any, x: Any) -> list[str]: ...

    def combine(self, state: Any, x: Any, predictions: Mapping[str, Any]) -> Combined: ...

    def observe(self, state: Any, x: Any, feedback: Any, predictions: Mapping[str, Any]) -> Any: ...

    def state_from_dict(self, d: Mapping[str, Any]) -> Any: ...


def check_models(models: Sequence[str]) -> tuple[str, ...]:
    ms = tuple(models)
    if not ms or any(not isinstance(m, str) or not m for m in ms) or len(set(ms)) != len(ms):
        raise ValidationError("models", "a non-empty list of distinct model names", list(ms))
    return ms


def check_rate(value: float, field: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValidationError(field, "a number > 0", value)
    return float(value)

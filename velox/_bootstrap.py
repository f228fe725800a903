"""What a Velox model starts from and retrains on besides its observation log.

:class:`Bootstrap` carries the training data (loaded rows) and starting user weights that a
deployment names (:class:`~inferline.velox.TrainingData`,
:class:`~inferline.velox.StartingWeights`); the runtime builds version 1 from it
(:func:`initial_result`) and hands the training rows to every retrain with the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferline.core.errors import InferlineError, ValidationError

from ._model import Observation, RetrainResult, VeloxModel, check_features

__all__ = ["Bootstrap", "initial_result", "with_features"]

log = logging.getLogger(__name__)

_CONCURRENT = 256  # feature calls in flight while featurizing training rows


@dataclass(frozen=True)
class Bootstrap:
    """Training rows (``seq`` 0, before the log), starting user weights, and whether version
    1 is fitted on the training rows (``fit``)."""

    training: tuple[Observation, ...] = ()
    user_weights: Mapping[str, np.ndarray] = field(default_factory=dict)
    fit: bool = False

    def __post_init__(self) -> None:
        if self.fit and not self.training:
            raise ValidationError("starting_weights.fit", "training_data to fit on", "none")


async def with_features(
    rows: Sequence[Observation],
    features: Callable[[Any], Awaitable[np.ndarray]],
    *,
    refresh_all: bool,
) -> list[Observation]:
    """``rows`` with features computed where they have none (or for all, ``refresh_all``: the
    feature model changed since they were logged); rows whose item fails are left out."""
    out: list[Observation | None] = list(rows)
    todo = [i for i, o in enumerate(rows) if refresh_all or o.features is None]

    async def one(i: int) -> None:
        o = rows[i]
        try:
            out[i] = replace(o, features=await features(o.x))
        except InferlineError as e:
            log.warning("training row %s of %r skipped: %s", i, o.uid, e)
            out[i] = None

    for a in range(0, len(todo), _CONCURRENT):
        await asyncio.gather(*(one(i) for i in todo[a : a + _CONCURRENT]))
    return [o for o in out if o is not None]


async def _user_rows(
    model: VeloxModel, state: Any, training: Sequence[Observation], users: set[str]
) -> dict[str, np.ndarray]:
    """Each user's training feature rows under ``state``: the confidence of their weights."""
    featurizer = model.featurizer(state)
    cache: dict[Any, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {}
    for o in training:
        if o.uid not in users:
            continue
        try:
            key: Any = o.x if isinstance(o.x, str | int) else repr(o.x)
            f = cache.get(key)
            if f is None:
                f = cache[key] = check_features(await featurizer(o.x), model.dim, model.name)
        except InferlineError:
            continue
        rows.setdefault(o.uid, []).append(f)
    return {u: np.array(r) for u, r in rows.items()}


async def initial_result(
    model: VeloxModel,
    boot: Bootstrap,
    lam: float,
) -> RetrainResult:
    """Version 1: ``model.initial()``, fitted on the training rows when ``boot.fit``, with the
    starting user weights over it; users with training rows but no confidence rows get them."""
    result = model.initial()
    training = list(boot.training)
    if boot.fit:
        if model.uses_logged_features:
            featurizer = model.featurizer(result.state)

            async def features(x: Any) -> np.ndarray:
                return check_features(await featurizer(x), model.dim, model.name)

            training = await with_features(training, features, refresh_all=False)
        result = await asyncio.to_thread(
            model.retrain, result.state, training, dict(result.user_weights), lam
        )
    if boot.user_weights:
        result = replace(result, user_weights={**result.user_weights, **boot.user_weights})
    missing = {u for u in result.user_weights if u not in result.user_features}
    if training and missing:
        extra = await _user_rows(model, result.state, training, missing)
        result = replace(result, user_features={**result.user_features, **extra})
    return result

"""The VeloxModel interface (thesis Listing 2.2) and the two stock implementations.

A Velox model is split in two (thesis §2.3): a shared feature function ``f(x; theta)`` that
changes slowly and is retrained offline, and a per-user linear model ``w_u`` learned online in
the serving layer. The user supplies the shared half as a :class:`VeloxModel`:

- ``featurizer(state)``: the feature function of one version's shared state ``theta``, an async
  callable ``x -> vector``. It may look ``x`` up in a materialized table
  (:class:`TableModel`) or call a model through any backend (:class:`SplitModel`, to which the
  frontend injects the call).
- ``retrain(state, observations, user_weights)``: offline training; returns the new shared
  state and user weights. The service runs it in a worker thread and switches versions
  atomically when it is done.
- ``loss(y, y_hat, x, uid)``: the quality metric the staleness detector watches.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core.errors import BackendError, NotFoundError, ValidationError

from ._codec import decode_value, encode_value
from ._mf import train_mf
from ._ridge import ridge_solve

__all__ = [
    "FeatureFn",
    "FeatureTable",
    "NewObservation",
    "Observation",
    "RetrainResult",
    "SplitModel",
    "TableModel",
    "VeloxModel",
    "check_features",
]

FeatureFn = Callable[[Any], Awaitable[np.ndarray]]
"""An async feature function: ``await features(x)`` is a float vector of the model's dim."""


@dataclass(frozen=True)
class NewObservation:
    """A feedback event to append to the observation log (the log assigns its ``seq``): what
    every store's ``append_observation`` and ``append_many`` take, so the fields are declared
    once rather than in each store's signature."""

    uid: str
    x: Any
    y: float
    version: int
    ts: float
    features: np.ndarray | None = None


@dataclass(frozen=True)
class Observation(NewObservation):
    """One logged feedback event: the event and its position in the log (``seq``, keyword
    only); the observation log is the retraining data set.

    ``features`` are those computed by version ``version`` when the observation arrived (kept so
    a restart can replay the log without recomputing them); None when not logged.
    """

    seq: int = field(kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "uid": self.uid,
            "x": encode_value(self.x),
            "y": self.y,
            "version": self.version,
            "ts": self.ts,
            "features": None if self.features is None else encode_value(self.features),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Observation:
        f = d.get("features")
        return cls(
            seq=int(d["seq"]),
            uid=str(d["uid"]),
            x=decode_value(d["x"]),
            y=float(d["y"]),
            version=int(d["version"]),
            ts=float(d["ts"]),
            features=None if f is None else np.asarray(decode_value(f), dtype=np.float64),
        )


@dataclass(frozen=True)
class RetrainResult:
    """What training produces: a shared state and per-user weights.

    ``user_features`` (optional) holds, per user, the feature rows (under the new state) the
    user's weights were fitted on; the service turns them into the user's confidence
    ``A = lam I + F^T F`` so online learning continues from the right uncertainty. Without
    them a user starts at the weights with only the prior's confidence.
    """

    state: Any
    user_weights: Mapping[str, np.ndarray] = field(default_factory=dict)
    user_features: Mapping[str, np.ndarray] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)


class VeloxModel(ABC):
    """The shared half of a split model. ``__init__`` stores parameters only."""

    name: str
    dim: int

    @abstractmethod
    def initial(self) -> RetrainResult:
        """Version 1: the shared state (and optional user weights) to serve first."""

    @abstractmethod
    def featurizer(self, state: Any) -> FeatureFn:
        """The feature function of one version's shared state."""

    @abstractmethod
    def retrain(
        self,
        state: Any,
        observations: Sequence[Observation],
        user_weights: Mapping[str, np.ndarray],
        lam: float,
    ) -> RetrainResult:
        """Offline training on the observation log (runs in a worker thread)."""

    def loss(self, y: float, y_hat: float, x: Any, uid: str) -> float:
        """Squared error by default."""
        return (y - y_hat) ** 2

    def feature_version(self) -> str | None:
        """The version of what computes features outside Velox (a backend model), or None.

        It is part of every feature- and prediction-cache key, so features computed by a
        backend model that has since been redeployed are never served again.
        """
        return None

    def retrain_can_change(self, built_with: str | None) -> bool:
        """Whether a retrain (given new observations) can produce other weights or features
        than the live version, built when :meth:`feature_version` was ``built_with``."""
        return True

    # Whether retrain reads ``Observation.features``: the runtime then computes them for rows
    # that have none (training data) and recomputes all when the feature version changed.
    uses_logged_features: bool = False

    def encode_state(self, state: Any) -> Any:
        """JSON-safe form of a shared state, for the version store."""
        return encode_value(state)

    def decode_state(self, data: Any) -> Any:
        return decode_value(data)


# --------------------------------------------------------------------------- table model


class FeatureTable:
    """A materialized feature function: item id -> row of a float64 matrix.

    Rows are returned as read-only views, so a cached feature vector cannot be modified by a
    caller. ``unknown="mean"`` answers an id that is not in the table with the mean row (how a
    brand-new item is scored until the next retrain); ``"error"`` raises NotFoundError.
    """

    def __init__(self, ids: Sequence[Hashable], matrix: np.ndarray, unknown: str = "error") -> None:
        m = np.array(matrix, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != len(ids):
            raise ValidationError("matrix", f"shape ({len(ids)}, d)", m.shape)
        if not np.all(np.isfinite(m)):
            raise ValidationError("matrix", "finite values", "non-finite entries")
        if unknown not in ("error", "mean"):
            raise ValidationError("unknown", "'error' or 'mean'", unknown)
        m.flags.writeable = False
        self.ids = list(ids)
        self.matrix = m
        self.unknown = unknown
        self.index = {x: i for i, x in enumerate(self.ids)}
        if len(self.index) != len(self.ids):
            raise ValidationError("ids", "unique item ids", "duplicates")
        mean = m.mean(axis=0) if len(m) else np.zeros(m.shape[1])
        mean.flags.writeable = False
        self._mean = mean

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, x: Any) -> np.ndarray:
        # An item id is a JSON string or integer: true would find item 1 (True == 1 in
        # Python), and a list or an object would score as the unknown item's mean.
        if (
            isinstance(x, bool)
            or not isinstance(x, str | int | float | np.integer)
            or (isinstance(x, float) and not math.isfinite(x))
        ):
            raise ValidationError("x", "an item id (a string or an integer)", x)
        i = self.index.get(x)
        if i is None:
            if self.unknown == "mean":
                return self._mean
            raise NotFoundError("item", x)
        return self.matrix[i]

    def to_dict(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "matrix": encode_value(self.matrix), "unknown": self.unknown}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureTable:
        return cls(d["ids"], decode_value(d["matrix"]), d.get("unknown", "error"))


class TableModel(VeloxModel):
    """Matrix-factorisation recommender: features are item factors in a materialized table.

    ``retrain`` refits the biased MF model (:func:`~inferline.velox.train_mf`) on the whole
    observation log, so items first seen after the last version get real features too.
    """

    def __init__(
        self,
        name: str,
        table: FeatureTable,
        *,
        user_weights: Mapping[str, np.ndarray] | None = None,
        user_features: Mapping[str, np.ndarray] | None = None,
        k: int | None = None,
        mf_lambda: float = 0.1,
        mf_iters: int = 10,
        seed: int = 0,
    ) -> None:
        self.name = name
        self.table = table
        self.dim = table.dim
        self.user_weights = dict(user_weights or {})
        self.user_features = dict(user_features or {})
        # The MF form has dim = k + 2 (a constant column and the item-bias column).
        self.k = table.dim - 2 if k is None else k
        self.mf_lambda = mf_lambda
        self.mf_iters = mf_iters
        self.seed = seed

    def initial(self) -> RetrainResult:
        return RetrainResult(self.table, self.user_weights, self.user_features)

    def featurizer(self, state: FeatureTable) -> FeatureFn:
        lookup = state.lookup

        async def features(x: Any) -> np.ndarray:
            return lookup(x)

        features.lookup = lookup  # type: ignore[attr-defined]  # sync fast path for top_k
        return features

    def retrain(
        self,
        state: FeatureTable,
        observations: Sequence[Observation],
        user_weights: Mapping[str, np.ndarray],
        lam: float,
    ) -> RetrainResult:
        if self.k < 1 or self.k + 2 != self.dim:
            raise ValidationError("k", f"dim - 2 = {self.dim - 2} for an MF-form table", self.k)
        if not observations:
            return RetrainResult(state, dict(user_weights), {}, {"observations": 0})
        users = [o.uid for o in observations]
        items = [o.x for o in observations]
        y = np.array([o.y for o in observations])
        mf = train_mf(
            users,
            items,
            y,
            k=self.k,
            lam=self.mf_lambda,
            iters=self.mf_iters,
            rng=np.random.default_rng(self.seed),
        )
        # Keep items the log never mentions: a retrain must not forget part of the catalogue.
        seen = set(mf.item_ids)
        keep = [x for x in state.ids if x not in seen]
        ids = list(mf.item_ids) + keep
        rows = [mf.item_features()]
        if keep:
            rows.append(state.matrix[[state.index[x] for x in keep]])
        table = FeatureTable(ids, np.vstack(rows), state.unknown)
        w = mf.user_weights()
        weights = {uid: w[j] for j, uid in enumerate(mf.user_ids)}
        feats: dict[str, list[np.ndarray]] = {}
        for uid, x in zip(users, items, strict=True):
            feats.setdefault(uid, []).append(table.lookup(x))
        return RetrainResult(
            table,
            weights,
            {uid: np.array(rows_) for uid, rows_ in feats.items()},
            {"observations": len(observations), "items": len(ids), "users": len(weights)},
        )

    def encode_state(self, state: FeatureTable) -> Any:
        return state.to_dict()

    def decode_state(self, data: Any) -> FeatureTable:
        return FeatureTable.from_dict(data)


# --------------------------------------------------------------------------- split model

RetrainFn = Callable[[Any, Sequence[Observation], Mapping[str, np.ndarray], float], RetrainResult]


class SplitModel(VeloxModel):
    """Features computed by a model served elsewhere (any backend), injected as ``features``.

    The frontend wires ``features`` to a backend call, e.g.
    ``SplitModel("songs", 64, features=lambda x: queue.predict("song-embedder", x))``.
    The shared state is a JSON value naming what the features came from (a backend model
    version, say); ``retrain`` defaults to refitting every user's ridge on the logged features
    (the backend model itself is trained outside inferline), and can be replaced. ``version``
    (optional) returns the feature model's current version: it keys the feature cache, and the
    default retrain can change something only once it differs from the version the live
    weights were fitted under (otherwise it reproduces what online learning already has).
    """

    uses_logged_features = True

    def __init__(
        self,
        name: str,
        dim: int,
        features: FeatureFn,
        *,
        state: Any = None,
        retrain_fn: RetrainFn | None = None,
        loss_fn: Callable[[float, float, Any, str], float] | None = None,
        version: Callable[[], str | None] | None = None,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValidationError("dim", "an int >= 1", dim)
        self.version = version
        self.name = name
        self.dim = dim
        self.features = features
        self.state = {} if state is None else state
        self.retrain_fn = retrain_fn
        self.loss_fn = loss_fn

    def initial(self) -> RetrainResult:
        return RetrainResult(self.state)

    def featurizer(self, state: Any) -> FeatureFn:
        return self.features

    def feature_version(self) -> str | None:
        return None if self.version is None else self.version()

    def retrain_can_change(self, built_with: str | None) -> bool:
        return self.retrain_fn is not None or self.feature_version() != built_with

    def retrain(
        self,
        state: Any,
        observations: Sequence[Observation],
        user_weights: Mapping[str, np.ndarray],
        lam: float,
    ) -> RetrainResult:
        if self.retrain_fn is not None:
            return self.retrain_fn(state, observations, user_weights, lam)
        rows: dict[str, list[Observation]] = {}
        for o in observations:
            if o.features is not None:
                rows.setdefault(o.uid, []).append(o)
        weights: dict[str, np.ndarray] = {}
        feats: dict[str, np.ndarray] = {}
        for uid, obs in rows.items():
            f = np.array([o.features for o in obs])
            weights[uid] = ridge_solve(f, np.array([o.y for o in obs]), lam)
            feats[uid] = f
        return RetrainResult(state, weights, feats, {"observations": len(observations)})

    def loss(self, y: float, y_hat: float, x: Any, uid: str) -> float:
        if self.loss_fn is not None:
            return float(self.loss_fn(y, y_hat, x, uid))
        return (y - y_hat) ** 2


def check_features(f: Any, dim: int, model: str) -> np.ndarray:
    """Validate a feature function's output: a finite float vector of length ``dim``.

    The result is read-only (it is shared through the feature cache); a writeable input is
    copied first so the caller's array is never frozen or aliased.
    """
    a = np.asarray(f, dtype=np.float64)
    if a.shape != (dim,):
        raise BackendError(
            f"velox:{model}", f"feature function returned shape {a.shape}, expected ({dim},)"
        )
    if not np.all(np.isfinite(a)):
        raise BackendError(f"velox:{model}", "feature function returned non-finite values")
    if a.flags.writeable:
        a = a.copy()
        a.flags.writeable = False
    return a

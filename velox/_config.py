"""Velox configuration: frozen dataclasses with JSON round trips."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from inferline.core.errors import ValidationError

__all__ = ["StalenessConfig", "StartingWeights", "TrainingData", "VeloxConfig"]


def _check_keys(cls: type, d: Any, name: str) -> None:
    if not isinstance(d, dict):
        raise ValidationError(name, "a JSON object", type(d).__name__)
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValidationError(name, f"only the keys {sorted(known)}", sorted(unknown))


def _positive(name: str, v: float, *, allow_zero: bool = False) -> None:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or v < 0
        or (v == 0 and not allow_zero)
    ):
        raise ValidationError(name, ">= 0" if allow_zero else "> 0", v)


@dataclass(frozen=True)
class StalenessConfig:
    """When is the shared model stale (thesis §2.6: the loss rises faster than a threshold)?

    Two exponentially weighted averages of the prequential loss (each observation's loss is
    computed with the weights *before* it is learned) run over the global stream: a fast one
    (``fast_halflife`` observations) and a slow one (``slow_halflife``). The fast average leads
    the slow one by roughly the rate at which the loss rises, so ``(fast - slow) / slow >
    threshold`` means "rising faster than ``threshold``". ``min_observations`` since the last
    (re)train must be seen before the rule can fire, and after a trigger it is re-armed only by
    a new version. A stale verdict starts a retrain only when the retrain can change something
    (:func:`~inferline.velox.retrain_blocker`): at least ``min_observations`` new observations
    are in the log since the live version was built, and the model is retrainable (a split
    model with the default retrain only when its feature model's version changed). A retrain that follows an abrupt drift at once learns from few new
    observations, and the new version's loss stays high but flat: then, ``min_observations``
    into the new version, a loss still above ``(1 + threshold)`` times the level before the
    drift triggers again (at most ``follow_up_retrains`` times per drift), each retrain with
    more of the new data.
    """

    # Defaults: on stationary squared-error noise the trend stays below ~0.22 over 50k
    # observations (seeded check in the tests), while a loss doubling over 2,000 observations is
    # flagged ~1,000 observations in.
    fast_halflife: float = 200.0
    slow_halflife: float = 2000.0
    threshold: float = 0.3
    min_observations: int = 1000
    auto_retrain: bool = True
    # After a drift's retrain, the rule above sees a flat (high) loss and would never fire
    # again; so, once min_observations have been seen on the new version, a loss still above
    # (1 + threshold) x the level before the drift is stale too, up to this many retrains.
    follow_up_retrains: int = 5

    def __post_init__(self) -> None:
        _positive("staleness.fast_halflife", self.fast_halflife)
        _positive("staleness.slow_halflife", self.slow_halflife)
        if self.fast_halflife >= self.slow_halflife:
            raise ValidationError(
                "staleness.fast_halflife",
                "< slow_halflife",
                (self.fast_halflife, self.slow_halflife),
            )
        _positive("staleness.threshold", self.threshold)
        _positive("staleness.min_observations", self.min_observations, allow_zero=True)
        _positive("staleness.follow_up_retrains", self.follow_up_retrains, allow_zero=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StalenessConfig:
        _check_keys(cls, d, "staleness")
        return cls(**d)


@dataclass(frozen=True)
class VeloxConfig:
    """Serving and learning parameters of one Velox model.

    - ``ridge_lambda``: L2 strength of each user's ridge regression, pulling ``w_u`` towards
      the average user weights the user started from (the bootstrap prior).
    - ``alpha``: default LinUCB exploration weight of ``top_k`` (0 = pure exploitation). On by
      default so the service does not only learn about what it already recommends; the bonus is
      in label units per unit of uncertainty, so scale it with the label noise.
    - ``refactor_every``: a user's inverse is recomputed from scratch (Cholesky of the
      accumulated Gram matrix) after this many Sherman-Morrison updates, bounding the drift of
      rank-one updates in floating point.
    - ``new_users``: ``"average"`` bootstraps an unseen uid from the average user weights;
      ``"reject"`` answers predict/top_k for an unseen uid with NotFoundError (observe always
      creates the user).
    - ``checkpoint_every``: observations between snapshots of user state; each observation is
      durable on its own (it is in the log), snapshots only bound the replay on restart.
    - ``partitions``/``owned_partitions``: uid-hash partitioning across frontend processes;
      this process serves (and writes) only the owned partitions (None = all).
    - ``max_items``: the longest item list ``top_k`` accepts (a request-size bound).

    The feature and prediction caches are shared by all models of a service and sized there.
    """

    ridge_lambda: float = 1.0
    alpha: float = 1.0
    refactor_every: int = 200
    new_users: str = "average"
    checkpoint_every: int = 1000
    partitions: int = 1
    owned_partitions: tuple[int, ...] | None = None
    max_items: int = 10_000
    staleness: StalenessConfig = field(default_factory=StalenessConfig)

    def __post_init__(self) -> None:
        _positive("ridge_lambda", self.ridge_lambda)
        _positive("alpha", self.alpha, allow_zero=True)
        for name in ("refactor_every", "checkpoint_every", "partitions", "max_items"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValidationError(name, "an int >= 1", v)
        if self.new_users not in ("average", "reject"):
            raise ValidationError("new_users", "'average' or 'reject'", self.new_users)
        if self.owned_partitions is not None:
            owned = tuple(self.owned_partitions)
            if not owned or not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < self.partitions
                for p in owned
            ):
                raise ValidationError(
                    "owned_partitions", f"a non-empty list of ints in [0, {self.partitions})", owned
                )
            object.__setattr__(self, "owned_partitions", tuple(sorted(set(owned))))
        if not isinstance(self.staleness, StalenessConfig):
            raise ValidationError("staleness", "a StalenessConfig", type(self.staleness).__name__)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owned_partitions"] = (
            None if self.owned_partitions is None else list(self.owned_partitions)
        )
        d["staleness"] = self.staleness.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VeloxConfig:
        _check_keys(cls, d, "config")
        d = dict(d)
        if "staleness" in d:
            d["staleness"] = StalenessConfig.from_dict(d["staleness"])
        if d.get("owned_partitions") is not None:
            d["owned_partitions"] = tuple(d["owned_partitions"])
        return cls(**d)


def _path(v: Any, name: str) -> str:
    if not isinstance(v, str) or not v:
        raise ValidationError(name, "a non-empty file path", v)
    return v


@dataclass(frozen=True)
class TrainingData:
    """Where a Velox model's training data lives: the ratings version 1 was trained on, which
    every retrain uses together with everything observed since.

    Exactly one source: ``file``, a CSV file with a header row naming ``uid``, ``item``,
    ``rating`` (and optionally ``ts``); or ``sqlite`` with ``table``, a SQLite table with those
    columns. An item that parses as JSON (``12``, ``"a"``, ``[0.5, 1]``) is that value,
    anything else is the string itself, so CSV item ids match the ids clients send.
    """

    file: str | None = None
    sqlite: str | None = None
    table: str | None = None

    def __post_init__(self) -> None:
        if (self.file is None) == (self.sqlite is None):
            raise ValidationError(
                "training_data", "exactly one of 'file' or 'sqlite'", self.to_dict()
            )
        if self.file is not None:
            _path(self.file, "training_data.file")
            if self.table is not None:
                raise ValidationError("training_data.table", "only with 'sqlite'", self.table)
        else:
            _path(self.sqlite, "training_data.sqlite")
            t = self.table
            if not isinstance(t, str) or not t.replace("_", "a").isalnum():
                raise ValidationError("training_data.table", "a table name (letters, digits, _)", t)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Any) -> TrainingData:
        _check_keys(cls, d, "training_data")
        return cls(**d)


@dataclass(frozen=True)
class StartingWeights:
    """What version 1 starts from, when the model is first created (a resumed model keeps its
    stored state).

    - ``users``: an ``.npz`` file with ``ids`` (user ids) and ``matrix`` (one row of ``dim``
      weights per user). With training data, each user's confidence starts from the feature
      rows of their training ratings, so online updates continue a fit instead of restarting.
    - ``fit``: train version 1 on the training data at start (the model's own retrain: matrix
      factorisation for a table model, which also refits the item features; per-user ridge on
      the feature model's features for a split model). Requires ``training_data``; ``users``
      then overrides the fitted weights of the users it names.
    """

    users: str | None = None
    fit: bool = False

    def __post_init__(self) -> None:
        if self.users is not None:
            _path(self.users, "starting_weights.users")
        if not isinstance(self.fit, bool):
            raise ValidationError("starting_weights.fit", "true or false", self.fit)
        if self.users is None and not self.fit:
            raise ValidationError(
                "starting_weights", "'users' (a weights file) and/or 'fit': true", {}
            )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fit": self.fit}
        if self.users is not None:
            d["users"] = self.users
        return d

    @classmethod
    def from_dict(cls, d: Any) -> StartingWeights:
        _check_keys(cls, d, "starting_weights")
        return cls(**d)

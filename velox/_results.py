"""Results of the Velox service calls: frozen dataclasses with JSON round trips."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._codec import decode_value, encode_value

__all__ = ["ObserveResult", "Prediction", "Ranked", "RetrainJob", "TopK"]


@dataclass(frozen=True)
class Prediction:
    uid: str
    score: float
    version: int
    new_user: bool
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "score": self.score,
            "version": self.version,
            "new_user": self.new_user,
            "cached": self.cached,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prediction:
        return cls(
            str(d["uid"]),
            float(d["score"]),
            int(d["version"]),
            bool(d["new_user"]),
            bool(d.get("cached", False)),
        )


@dataclass(frozen=True)
class Ranked:
    """One recommended item: ``score`` is ``w.f``, ``bonus`` the LinUCB exploration term."""

    item: Any
    index: int
    score: float
    bonus: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "item": encode_value(self.item),
            "index": self.index,
            "score": self.score,
            "bonus": self.bonus,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ranked:
        return cls(decode_value(d["item"]), int(d["index"]), float(d["score"]), float(d["bonus"]))


@dataclass(frozen=True)
class TopK:
    uid: str
    version: int
    alpha: float
    new_user: bool
    items: tuple[Ranked, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "version": self.version,
            "alpha": self.alpha,
            "new_user": self.new_user,
            "items": [r.to_dict() for r in self.items],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TopK:
        return cls(
            str(d["uid"]),
            int(d["version"]),
            float(d["alpha"]),
            bool(d["new_user"]),
            tuple(Ranked.from_dict(r) for r in d["items"]),
        )


@dataclass(frozen=True)
class RetrainJob:
    """A background retrain: ``status`` is running, done or failed."""

    job: int
    model: str
    reason: str
    status: str
    started_s: float
    finished_s: float | None = None
    from_version: int | None = None
    version: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "model": self.model,
            "reason": self.reason,
            "status": self.status,
            "started_s": self.started_s,
            "finished_s": self.finished_s,
            "from_version": self.from_version,
            "version": self.version,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RetrainJob:
        return cls(**d)


@dataclass(frozen=True)
class ObserveResult:
    """An acknowledged observation: ``seq`` is its position in the durable log; ``y_hat`` and
    ``loss`` are the prediction and loss *before* learning from it."""

    uid: str
    seq: int
    y_hat: float
    loss: float
    version: int
    new_user: bool
    stale: bool = False
    retrain: RetrainJob | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "seq": self.seq,
            "y_hat": self.y_hat,
            "loss": self.loss,
            "version": self.version,
            "new_user": self.new_user,
            "stale": self.stale,
            "retrain": None if self.retrain is None else self.retrain.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ObserveResult:
        r = d.get("retrain")
        return cls(
            str(d["uid"]),
            int(d["seq"]),
            float(d["y_hat"]),
            float(d["loss"]),
            int(d["version"]),
            bool(d["new_user"]),
            bool(d.get("stale", False)),
            None if r is None else RetrainJob.from_dict(r),
        )

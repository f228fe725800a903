"""One loaded version of a Velox model (see :mod:`inferline.velox._runtime`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferline.queueing import key_prefix

from ._model import FeatureFn
from ._ridge import UserRidge
from ._store import VersionRecord

__all__ = ["Live"]


class Live:
    """One loaded version: shared state, feature function, owned users.

    Cache keys carry the version and the feature model's version (``fv``): features computed
    by a backend model that was redeployed since are unreachable, not served.
    """

    __slots__ = (
        "_fv",
        "built_with",
        "default_w",
        "dirty",
        "featurizer",
        "fprefix",
        "model",
        "observed",
        "pprefix",
        "record",
        "state",
        "upto",
        "users",
        "version",
        "w_sum",
    )

    def __init__(
        self, model: str, record: VersionRecord, state: Any, featurizer: FeatureFn, dim: int
    ) -> None:
        self.model = model
        self.version = record.version
        self.record = record
        self.state = state
        self.featurizer = featurizer
        # the feature model's version this version's weights were fitted under
        self.built_with: str | None = record.info.get("features_version")
        self.users: dict[str, UserRidge] = {}
        self.upto: dict[str, int] = {}  # uid -> seq of the last observation folded in
        self.dirty: set[str] = set()
        self.observed = 0  # observations after base_seq folded in (replayed or live)
        self.w_sum = np.zeros(dim)
        self.default_w = np.zeros(dim)
        self._fv: Any = ...
        self.fprefix = self.pprefix = b""
        self.prefixes(None)

    def tokens(self, fv: str | None) -> tuple[str | int, str]:
        """The feature- and prediction-cache version tokens under feature version ``fv``."""
        if fv is None:
            return self.version, f"p{self.version}"
        return f"{self.version}@{fv}", f"p{self.version}@{fv}"

    def prefixes(self, fv: str | None) -> bool:
        """Point the cache prefixes at feature version ``fv``; True when it changed."""
        if fv == self._fv:
            return False
        first = self._fv is ...
        self._fv = fv
        f, p = self.tokens(fv)
        self.fprefix, self.pprefix = key_prefix(self.model, f), key_prefix(self.model, p)
        return not first

    def average(self) -> np.ndarray:
        """Bootstrap prior of a new user: the average of the existing user weights."""
        return self.w_sum / len(self.users) if self.users else self.default_w.copy()

    def add_user(self, uid: str, u: UserRidge) -> None:
        old = self.users.get(uid)
        if old is not None:
            self.w_sum -= old.w
        self.users[uid] = u
        self.w_sum += u.w

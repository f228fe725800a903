"""Biased matrix factorisation by alternating least squares (the offline half of the split model).

``r_ui ~ mu + b_u + b_i + p_u . q_i``, fitted by ALS with weighted-lambda regularisation (each
entity's penalty scales with its number of ratings, which keeps rarely rated items from
overfitting). The result is folded into the Velox form ``r_ui = w_u . f_i`` with

    f_i = [q_i, 1, mu + b_i]        w_u = [p_u, b_u, 1]

so the per-user linear model learned online also learns the user's bias and how strongly the
item's popularity term applies to them. Pure numpy; deterministic for a given generator.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from inferline.core.errors import ValidationError

__all__ = ["MFResult", "train_mf"]


@dataclass(frozen=True)
class MFResult:
    """Fitted factors; ``item_features``/``user_weights`` are the Velox form (dim = k + 2)."""

    user_ids: tuple[str, ...]
    item_ids: tuple[Hashable, ...]
    mu: float
    user_factors: np.ndarray
    user_bias: np.ndarray
    item_factors: np.ndarray
    item_bias: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.item_factors.shape[1]) + 2

    def item_features(self) -> np.ndarray:
        n = len(self.item_ids)
        return np.hstack([self.item_factors, np.ones((n, 1)), (self.mu + self.item_bias)[:, None]])

    def user_weights(self) -> np.ndarray:
        n = len(self.user_ids)
        return np.hstack([self.user_factors, self.user_bias[:, None], np.ones((n, 1))])

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Predictions for index arrays into ``user_ids``/``item_ids``."""
        return (
            self.mu
            + self.user_bias[users]
            + self.item_bias[items]
            + np.sum(self.user_factors[users] * self.item_factors[items], axis=1)
        )


def _index(values: Sequence[Hashable]) -> tuple[list[Hashable], np.ndarray]:
    ids: dict[Hashable, int] = {}
    idx = np.fromiter(
        (ids.setdefault(v, len(ids)) for v in values), dtype=np.int64, count=len(values)
    )
    return list(ids), idx


def _solve_side(
    idx: np.ndarray, other: np.ndarray, target: np.ndarray, n: int, lam: float
) -> np.ndarray:
    """Ridge per entity: rows ``other`` (with a bias column appended) against ``target``."""
    k1 = other.shape[1] + 1
    design = np.hstack([other, np.ones((len(other), 1))])
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    out = np.zeros((n, k1))
    eye = np.eye(k1)
    for e in range(n):
        rows = order[bounds[e] : bounds[e + 1]]
        if len(rows) == 0:
            continue
        x = design[rows]
        out[e] = np.linalg.solve(x.T @ x + lam * len(rows) * eye, x.T @ target[rows])
    return out


def train_mf(
    users: Sequence[str],
    items: Sequence[Hashable],
    ratings: Sequence[float] | np.ndarray,
    *,
    k: int = 8,
    lam: float = 0.1,
    iters: int = 10,
    rng: np.random.Generator,
) -> MFResult:
    """Fit the biased MF model to (user, item, rating) triples by ALS."""
    y = np.asarray(ratings, dtype=np.float64)
    if not (len(users) == len(items) == len(y)) or len(y) == 0:
        raise ValidationError(
            "ratings",
            "equal-length, non-empty users/items/ratings",
            (len(users), len(items), len(y)),
        )
    if not np.all(np.isfinite(y)):
        raise ValidationError("ratings", "finite numbers", "non-finite values")
    if k < 1 or iters < 1 or lam <= 0:
        raise ValidationError("k/iters/lam", "k >= 1, iters >= 1, lam > 0", (k, iters, lam))
    user_ids, u = _index(users)
    item_ids, i = _index(items)
    nu, ni = len(user_ids), len(item_ids)
    mu = float(y.mean())
    p = rng.normal(0.0, 0.1, size=(nu, k))
    q = rng.normal(0.0, 0.1, size=(ni, k))
    bu = np.zeros(nu)
    bi = np.zeros(ni)
    for _ in range(iters):
        z = _solve_side(u, q[i], y - mu - bi[i], nu, lam)
        p, bu = z[:, :k], z[:, k]
        z = _solve_side(i, p[u], y - mu - bu[u], ni, lam)
        q, bi = z[:, :k], z[:, k]
    return MFResult(tuple(str(x) for x in user_ids), tuple(item_ids), mu, p, bu, q, bi)

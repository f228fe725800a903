"""Per-user ridge regression learned online (thesis §2.4, Eq. 2.2).

Each user ``u`` has weights ``w_u`` over the shared features ``f(x)``. With prior mean ``w0``
(the average user weights when the user first appeared) and regularisation ``lam``, the weights
solve

    (lam I + F^T F) w = lam w0 + F^T y,

i.e. ``A w = b``. Refitting that from scratch costs O(n d^2 + d^3) per observation (the original
Velox prototype); here one observation is folded in by a Sherman-Morrison rank-one update of
``A^{-1}``, which is O(d^2), and the weights move by the recursive-least-squares step
``w += A_new^{-1} f (y - w.f)``. Rank-one updates accumulate rounding error, so every
``refactor_every`` updates ``A^{-1}`` and ``w`` are recomputed from the exactly accumulated
``A`` and ``b`` by a Cholesky factorisation.

At d = 50 the arithmetic of one update is ~10k flops, so the cost is numpy call overhead; the
update therefore issues few calls (BLAS ``ddot``/``daxpy``/``dger`` on the arrays in place), and the exact
``A`` and ``b`` are not touched per observation but accumulated from a small buffer of recent
rows with one matrix product when they are needed (refactorisation, snapshot).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import daxpy, ddot, dger

from inferline.core.errors import ValidationError

__all__ = ["UserRidge", "ridge_solve"]


def ridge_solve(
    features: np.ndarray, y: np.ndarray, lam: float, prior: np.ndarray | None = None
) -> np.ndarray:
    """The closed-form ridge solution from scratch (the baseline the online update replaces)."""
    f = np.asarray(features, dtype=np.float64)
    d = f.shape[1]
    w0 = np.zeros(d) if prior is None else np.asarray(prior, dtype=np.float64)
    a = f.T @ f + lam * np.eye(d)
    b = f.T @ np.asarray(y, dtype=np.float64) + lam * w0
    return np.linalg.solve(a, b)


class UserRidge:
    """Online ridge state of one user: ``w``, ``A^{-1}`` and the exact ``A``, ``b``.

    ``epoch`` is a stamp the owner changes on every update, so prediction-cache keys that
    include it never serve a prediction made with older weights.
    """

    __slots__ = (
        "_b",
        "_gram",
        "_pending_f",
        "_pending_y",
        "a_inv",
        "epoch",
        "lam",
        "n",
        "since_refactor",
        "w",
    )

    def __init__(self, prior: np.ndarray, lam: float) -> None:
        p = np.array(prior, dtype=np.float64)
        if p.ndim != 1 or not np.all(np.isfinite(p)):
            raise ValidationError("prior", "a finite 1-d float vector", p.shape)
        d = p.shape[0]
        self.lam = float(lam)
        self.w = p
        self._gram = lam * np.eye(d)  # A
        self.a_inv = np.eye(d) / lam
        self._b = lam * p
        self._pending_f: list[np.ndarray] = []
        self._pending_y: list[float] = []
        self.n = 0
        self.since_refactor = 0
        self.epoch = 0

    @property
    def dim(self) -> int:
        return int(self.w.shape[0])

    @property
    def gram(self) -> np.ndarray:
        """The exact ``A = lam I + sum f f^T`` (plus whatever a rebuild started from)."""
        self._flush()
        return self._gram

    @property
    def b(self) -> np.ndarray:
        self._flush()
        return self._b

    def _flush(self) -> None:
        if self._pending_f:
            f = np.array(self._pending_f)
            self._gram += f.T @ f
            self._b += f.T @ np.array(self._pending_y)
            self._pending_f.clear()
            self._pending_y.clear()

    @classmethod
    def from_stats(cls, gram: np.ndarray, b: np.ndarray, n: int, lam: float) -> UserRidge:
        """Rebuild from the stored sufficient statistics (restart, rollback, retrain)."""
        self = cls.__new__(cls)
        self.lam = float(lam)
        self._gram = np.array(gram, dtype=np.float64)
        self._b = np.array(b, dtype=np.float64)
        self._pending_f = []
        self._pending_y = []
        self.n = int(n)
        self.epoch = 0
        self.refactor()
        return self

    @classmethod
    def from_weights(
        cls, w: np.ndarray, features: np.ndarray, lam: float, n: int | None = None
    ) -> UserRidge:
        """State whose solution is exactly ``w`` and whose confidence reflects ``features``.

        Used when an offline retrain hands back user weights: ``A = lam I + F^T F`` carries the
        uncertainty of the rows the user was trained on, and ``b = A w`` makes ``A^{-1} b = w``.
        """
        w = np.asarray(w, dtype=np.float64)
        f = np.asarray(features, dtype=np.float64).reshape(-1, len(w))
        gram = lam * np.eye(len(w)) + f.T @ f
        return cls.from_stats(gram, gram @ w, len(f) if n is None else n, lam)

    def predict(self, f: np.ndarray) -> float:
        return float(self.w @ f)

    def uncertainty(self, feats: np.ndarray) -> np.ndarray:
        """LinUCB width ``sqrt(f^T A^{-1} f)`` for each row of ``feats`` (shape (m, d))."""
        # (F A^-1) * F summed by row: one GEMM, far faster than a three-operand einsum.
        q = np.sum((feats @ self.a_inv) * feats, axis=1)
        return np.sqrt(np.maximum(q, 0.0))

    def update(self, f: np.ndarray, y: float, refactor_every: int) -> float:
        """Fold in one observation in O(d^2); returns the prediction made before the update.

        ``f`` must be a float64 vector that nobody mutates afterwards (it is kept by reference
        until the next flush).
        """
        a_inv = self.a_inv
        u = a_inv @ f
        denom = 1.0 + ddot(f, u)
        y_hat = ddot(self.w, f)
        daxpy(u, self.w, a=(y - y_hat) / denom)  # w += (y - y_hat) / denom * u, in place
        # A^-1 is symmetric and C-ordered, so its transpose is the Fortran-ordered array BLAS
        # wants and dger rewrites it in place: A^-1 -= u u^T / denom.
        dger(-1.0 / denom, u, u, a=a_inv.T, overwrite_a=True)
        self._pending_f.append(f)
        self._pending_y.append(y)
        self.n += 1
        self.since_refactor += 1
        if self.since_refactor >= refactor_every:
            self.refactor()
        return y_hat

    def refactor(self) -> None:
        """Recompute ``A^{-1}`` and ``w`` exactly from ``A`` and ``b``."""
        self._flush()
        c = np.linalg.cholesky(self._gram)
        c_inv = np.linalg.inv(c)  # triangular and well conditioned, because A >= lam I
        a_inv = c_inv.T @ c_inv
        # Exactly symmetric (rank-one updates u u^T then keep it so), and C-contiguous because
        # update() hands its transpose to BLAS as the Fortran-ordered matrix.
        self.a_inv = np.ascontiguousarray((a_inv + a_inv.T) * 0.5)
        self.w = self.a_inv @ self._b
        self.since_refactor = 0

    def copy(self) -> UserRidge:
        self._flush()
        other = UserRidge.__new__(UserRidge)
        other.lam, other.n, other.epoch = self.lam, self.n, self.epoch
        other.since_refactor = self.since_refactor
        other.w, other.a_inv = self.w.copy(), self.a_inv.copy()
        other._gram, other._b = self._gram.copy(), self._b.copy()
        other._pending_f, other._pending_y = [], []
        return other

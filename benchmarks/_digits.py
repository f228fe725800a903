"""A family of real classifiers trained at run time on scikit-learn's digits (1,797 labelled 8x8
images that ship with scikit-learn), for the selection benchmarks and their tests.

``digits_classifier(kind=...)`` is a model-container factory for the bundled runtime
(``ModelSpec("nb", source=SOURCE, params={"kind": "nb"})``): the container trains in ``load()``
inside its replica process with a fixed seed, so every replica holds the same model and nothing
is unpickled. Inputs are 64 raw pixel values (0..16), one vector per query; outputs are class
labels (ints).

Replica processes import it as ``benchmarks._digits`` (``SOURCE``): they run ``python -m``, which
puts the working directory on ``sys.path``, so run the benchmarks and the tests from the
checkout's root (as ``make test`` and the benchmarks' docstrings do). It lives here, not in
``selection/``, because the product never serves it: it is a test and benchmark model.

Kinds (accuracy on the seeded 70/30 split): ``nb`` Gaussian naive Bayes (~0.85), ``tree``
decision tree (~0.84), ``logreg`` logistic regression (~0.97), ``mlp`` (~0.98), ``forest``
random forest (~0.97), ``knn`` 3-nearest neighbours (~0.99), ``svc`` RBF SVM (~0.99).

Options that make the family useful for selection experiments:

- ``features``: train on a subset of the 64 pixels (random-subspace ensemble members: similar
  accuracy, diverse errors, so ensembles gain like Rafiki's ImageNet ensembles);
- ``distort(x, spec)``: input distortions (``"noise:SIGMA"``, ``"flip"``, ``"shift:N"``,
  ``"invert"``) for per-user input distributions; ``train_distort`` trains a model on
  distorted images (so different users have different best models);
- ``delay_s`` / ``per_item_s``: sleep per batch (a slow model); ``tail_s``: an extra
  exponentially distributed sleep per batch with that mean (a straggler, seeded);
- ``kind="forest"`` with ``trees``: a variant family (5 trees ~0.88 accuracy and ~0.3 ms,
  300 trees ~0.98 and ~10 ms), ``n_jobs`` threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferline.core import ValidationError

__all__ = [
    "KINDS",
    "SOURCE",
    "DigitsClassifier",
    "digits_classifier",
    "digits_data",
    "distort",
    "fit_classifier",
]

log = logging.getLogger(__name__)

KINDS = ("nb", "tree", "logreg", "mlp", "forest", "knn", "svc")
SOURCE = "benchmarks._digits:digits_classifier"


def digits_data(
    seed: int = 0, test_fraction: float = 0.3
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: raw 0..16 pixels (float32), stratified seeded split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(
        x.astype(np.float32),
        y.astype(np.int64),
        test_size=test_fraction,
        random_state=seed,
        stratify=y,
    )
    return xtr, ytr, xte, yte


def _estimator(kind: str, seed: int, trees: int = 100, n_jobs: int = 1) -> Any:
    if kind == "nb":
        from sklearn.naive_bayes import GaussianNB

        return GaussianNB()
    if kind == "tree":
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(random_state=seed)
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=2000)
    if kind == "mlp":
        from sklearn.neural_network import MLPClassifier

        return MLPClassifier((64,), max_iter=1000, random_state=seed)
    if kind == "forest":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(trees, random_state=seed, n_jobs=n_jobs)
    if kind == "knn":
        from sklearn.neighbors import KNeighborsClassifier

        return KNeighborsClassifier(3)
    if kind == "svc":
        from sklearn.svm import SVC

        return SVC()
    raise ValidationError("kind", f"one of {list(KINDS)!r}", kind)


def fit_classifier(
    kind: str,
    seed: int = 0,
    features: Sequence[int] | None = None,
    split_seed: int = 0,
    trees: int = 100,
    n_jobs: int = 1,
    train_distort: str | None = None,
) -> Any:
    """A fitted classifier of ``kind`` on the training split (pixels scaled to [0, 1]);
    ``trees`` and ``n_jobs`` apply to ``forest`` (a variant family: more trees, more accurate
    and slower)."""
    import warnings

    xtr, ytr, _, _ = digits_data(split_seed)
    if train_distort:
        xtr = distort(xtr, train_distort, seed)
    xtr = xtr / 16.0
    if features is not None:
        xtr = xtr[:, list(features)]
    est = _estimator(kind, seed, trees, n_jobs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLP convergence chatter
        est.fit(xtr, ytr)
    return est


def distort(x: np.ndarray, spec: str | None, seed: int = 0) -> np.ndarray:
    """Apply a distortion to a batch of raw-pixel images (rows of 64 values, 0..16)."""
    if not spec:
        return x
    kind, _, arg = spec.partition(":")
    imgs = np.asarray(x, dtype=np.float32).reshape(-1, 8, 8)
    if kind == "noise":
        rng = np.random.default_rng(seed)
        out = imgs + rng.normal(0.0, float(arg or 4.0), imgs.shape)
    elif kind == "flip":
        out = imgs[:, :, ::-1]
    elif kind == "shift":
        out = np.roll(imgs, int(arg or 1), axis=2)
    elif kind == "invert":
        out = 16.0 - imgs
    else:
        raise ValidationError("distort", "'noise:SIGMA', 'flip', 'shift:N' or 'invert'", spec)
    return np.clip(out, 0.0, 16.0).reshape(len(imgs), 64).astype(np.float32)


class DigitsClassifier:
    """Model container: ``predict_batch(list of 64-vectors) -> list of int labels``."""

    def __init__(
        self,
        kind: str = "logreg",
        seed: int = 0,
        features: Sequence[int] | None = None,
        delay_s: float = 0.0,
        per_item_s: float = 0.0,
        split_seed: int = 0,
        trees: int = 100,
        n_jobs: int = 1,
        tail_s: float = 0.0,
        train_distort: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValidationError("kind", f"one of {list(KINDS)!r}", kind)
        self.kind = kind
        self.seed = seed
        self.features = None if features is None else [int(f) for f in features]
        self.delay_s = float(delay_s)
        self.per_item_s = float(per_item_s)
        self.split_seed = split_seed
        self.trees = int(trees)
        self.n_jobs = int(n_jobs)
        self.tail_s = float(tail_s)
        self.train_distort = train_distort
        self._rng = np.random.default_rng(seed)
        self._est: Any = None

    def load(self) -> None:
        self._est = fit_classifier(
            self.kind,
            self.seed,
            self.features,
            self.split_seed,
            self.trees,
            self.n_jobs,
            self.train_distort,
        )

    def predict_batch(self, inputs: list[Any]) -> list[int]:
        if self._est is None:
            self.load()
        x = np.stack([np.asarray(v, dtype=np.float32).reshape(64) for v in inputs]) / 16.0
        if self.features is not None:
            x = x[:, self.features]
        out = self._est.predict(x)
        wait = self.delay_s + self.per_item_s * len(inputs)
        if self.tail_s > 0:  # a straggler: exponential extra delay per batch (seeded)
            wait += float(self._rng.exponential(self.tail_s))
        if wait > 0:
            time.sleep(wait)
        return [int(v) for v in out]


def digits_classifier(
    kind: str = "logreg",
    seed: int = 0,
    features: Sequence[int] | None = None,
    delay_s: float = 0.0,
    per_item_s: float = 0.0,
    split_seed: int = 0,
    trees: int = 100,
    n_jobs: int = 1,
    tail_s: float = 0.0,
    train_distort: str | None = None,
) -> DigitsClassifier:
    """Factory for ``ModelSpec.source`` (``SOURCE``)."""
    return DigitsClassifier(
        kind, seed, features, delay_s, per_item_s, split_seed, trees, n_jobs, tail_s, train_distort
    )

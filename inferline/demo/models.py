"""The demo's model containers: real classifiers trained at start-up on scikit-learn's digits.

Each container trains in ``load()`` (inside its replica process) from the digits data that
ships with scikit-learn, with a fixed seed, so every replica of a model holds the same
weights without any file or network access, and nothing is ever unpickled.

* ``preprocess``: CPU feature stage: scales the 8x8 image to [0, 1] and deskews it by its
  second moments (a classic digits trick), vectorized over the batch.
* ``mlp``: a small torch MLP, fast and fairly accurate; returns class probabilities.
* ``forest``: a scikit-learn random forest, the larger and slower model: its cost is mostly a
  fixed per-call overhead of walking every tree, so it batches very well (like a GPU model).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = [
    "MLP",
    "Forest",
    "Preprocess",
    "digits_split",
    "forest",
    "mlp",
    "preprocess",
]

log = logging.getLogger(__name__)

N_FEATURES = 64


def digits_split(seed: int = 0, train_fraction: float = 0.6) -> tuple[np.ndarray, ...]:
    """``(x_train, y_train, x_test, y_test)``: raw 0..16 pixel values as float32, seeded split."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    cut = int(len(x) * train_fraction)
    x = x.astype(np.float32)
    y = y.astype(np.int64)
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _deskew(images: np.ndarray) -> np.ndarray:
    """Shear each 8x8 image so its principal axis is vertical (vectorized over the batch)."""
    n = images.shape[0]
    imgs = images.reshape(n, 8, 8)
    total = imgs.sum(axis=(1, 2)) + 1e-6
    ys, xs = np.mgrid[0:8, 0:8].astype(np.float32)
    my = (imgs * ys).sum(axis=(1, 2)) / total
    mx = (imgs * xs).sum(axis=(1, 2)) / total
    cov = (imgs * (xs - mx[:, None, None]) * (ys - my[:, None, None])).sum(axis=(1, 2)) / total
    var = (imgs * (ys - my[:, None, None]) ** 2).sum(axis=(1, 2)) / total + 1e-6
    alpha = cov / var
    # Shift each row by alpha * (row - center), with linear interpolation between columns.
    shift = alpha[:, None] * (np.arange(8, dtype=np.float32)[None, :] - 3.5)  # (n, 8 rows)
    src = xs[None, :, :] + shift[:, :, None]
    lo = np.clip(np.floor(src).astype(np.int64), 0, 7)
    hi = np.clip(lo + 1, 0, 7)
    w = np.clip(src - np.floor(src), 0.0, 1.0)
    rows = np.arange(8)[None, :, None]
    b = np.arange(n)[:, None, None]
    out = imgs[b, rows, lo] * (1 - w) + imgs[b, rows, hi] * w
    inside = (src >= 0) & (src <= 7)
    return np.where(inside, out, 0.0).reshape(n, 64).astype(np.float32)


def _features(raw: np.ndarray) -> np.ndarray:
    return _deskew(np.clip(raw, 0.0, 16.0) / 16.0)


def _as_batch(inputs: list[Any], what: str) -> np.ndarray:
    try:
        a = np.stack([np.asarray(x, dtype=np.float32).reshape(N_FEATURES) for x in inputs])
    except (ValueError, TypeError) as e:
        from inferline.core import ValidationError

        raise ValidationError(f"{what} input", f"{N_FEATURES} numbers", str(e)) from None
    return a


class Preprocess:
    """Raw pixels (64 numbers in 0..16) -> deskewed features in [0, 1] (float32[64])."""

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        feats = _features(_as_batch(inputs, "preprocess"))
        return list(feats)


def preprocess() -> Preprocess:
    return Preprocess()


class MLP:
    """Torch MLP 64-``hidden``-``hidden``-10 trained at load; outputs float32[10] probabilities."""

    def __init__(self, hidden: int = 128, steps: int = 150, seed: int = 0) -> None:
        self.hidden = hidden
        self.steps = steps
        self.seed = seed
        self._net: Any = None

    def load(self) -> None:
        import torch

        torch.manual_seed(self.seed)
        x, y, _, _ = digits_split(self.seed)
        xt = torch.from_numpy(_features(x))
        yt = torch.from_numpy(y)
        net = torch.nn.Sequential(
            torch.nn.Linear(N_FEATURES, self.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(self.hidden, self.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(self.hidden, 10),
        )
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        lossf = torch.nn.CrossEntropyLoss()
        for _ in range(self.steps):  # full-batch: the training set is ~1,000 images
            opt.zero_grad()
            loss = lossf(net(xt), yt)
            loss.backward()
            opt.step()
        net.eval()
        self._net = net

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        import torch

        if self._net is None:
            self.load()
        x = torch.from_numpy(_as_batch(inputs, "mlp"))
        with torch.inference_mode():
            p = torch.softmax(self._net(x), dim=1).numpy()
        return list(p.astype(np.float32))


def mlp(hidden: int = 128, steps: int = 150, seed: int = 0) -> MLP:
    return MLP(hidden, steps, seed)


class Forest:
    """Random forest (scikit-learn) trained at load; outputs float32[10] probabilities."""

    def __init__(self, trees: int = 200, seed: int = 0) -> None:
        self.trees = trees
        self.seed = seed
        self._rf: Any = None

    def load(self) -> None:
        from sklearn.ensemble import RandomForestClassifier

        x, y, _, _ = digits_split(self.seed)
        self._rf = RandomForestClassifier(self.trees, random_state=self.seed, n_jobs=1)
        self._rf.fit(_features(x), y)

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        if self._rf is None:
            self.load()
        p = self._rf.predict_proba(_as_batch(inputs, "forest"))
        return list(p.astype(np.float32))


def forest(trees: int = 200, seed: int = 0) -> Forest:
    return Forest(trees, seed)

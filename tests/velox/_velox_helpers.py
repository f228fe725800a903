"""Seeded catalogues and models shared by the Velox tests (a uniquely named module, because
several test folders have a conftest.py and ``import conftest`` would pick any of them)."""

from __future__ import annotations

import numpy as np

from inferline.velox import FeatureTable, TableModel

DIM = 6


def make_table(
    n_items: int = 40, dim: int = DIM, seed: int = 0, unknown: str = "error"
) -> FeatureTable:
    rng = np.random.default_rng(seed)
    return FeatureTable(list(range(n_items)), rng.normal(size=(n_items, dim)), unknown)


def make_model(name: str = "m", n_items: int = 40, dim: int = DIM, seed: int = 0) -> TableModel:
    return TableModel(name, make_table(n_items, dim, seed), mf_iters=3, seed=seed)

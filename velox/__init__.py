"""Velox: online personalization on top of any backend's models (thesis ch. 2).

A model is split into a shared feature function (a materialized table, or a model served by a
backend) and per-user linear models learned online in the serving layer, with LinUCB
exploration in ``top_k``, versioned retraining triggered by staleness, rollback, and durable
user state (SQLite WAL by default, Redis optionally) partitioned by uid across frontends.
"""

from ._codec import decode_value, encode_value
from ._config import StalenessConfig, VeloxConfig
from ._http import make_velox_router
from ._mf import MFResult, train_mf
from ._model import (
    FeatureFn,
    FeatureTable,
    NewObservation,
    Observation,
    RetrainResult,
    SplitModel,
    TableModel,
    VeloxModel,
    check_features,
)
from ._partition import WrongPartitionError, partition_of
from ._redis import RedisStore
from ._results import ObserveResult, Prediction, Ranked, RetrainJob, TopK
from ._ridge import UserRidge, ridge_solve
from ._service import VeloxService
from ._staleness import LossStats, StalenessDetector, StalenessVerdict
from ._store import SQLiteStore, UserRow, VeloxStore, VersionRecord

__all__ = [
    "FeatureFn",
    "FeatureTable",
    "LossStats",
    "MFResult",
    "NewObservation",
    "Observation",
    "ObserveResult",
    "Prediction",
    "Ranked",
    "RedisStore",
    "RetrainJob",
    "RetrainResult",
    "SQLiteStore",
    "SplitModel",
    "StalenessConfig",
    "StalenessDetector",
    "StalenessVerdict",
    "TableModel",
    "TopK",
    "UserRidge",
    "UserRow",
    "VeloxConfig",
    "VeloxModel",
    "VeloxService",
    "VeloxStore",
    "VersionRecord",
    "WrongPartitionError",
    "check_features",
    "decode_value",
    "encode_value",
    "make_velox_router",
    "partition_of",
    "ridge_solve",
    "train_mf",
]

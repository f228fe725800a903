"""Velox: online personalization on top of any backend's models (thesis ch. 2).

A model is split into a shared feature function (a materialized table, or a model served by a
backend) and per-user linear models learned online in the serving layer, with LinUCB
exploration in ``top_k``, versioned retraining triggered by staleness, rollback, and durable
user state (SQLite WAL by default, Redis optionally) partitioned by uid across frontends.
"""

from ._bootstrap import Bootstrap
from ._codec import decode_value, encode_value
from ._config import StalenessConfig, StartingWeights, TrainingData, VeloxConfig
from ._data import load_training_data, load_user_weights, parse_item
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
from ._staleness import LossStats, StalenessDetector, StalenessVerdict, retrain_blocker
from ._store import SQLiteStore, UserRow, VeloxStore, VersionRecord

__all__ = [
    "Bootstrap",
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
    "StartingWeights",
    "TableModel",
    "TopK",
    "TrainingData",
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
    "load_training_data",
    "load_user_weights",
    "make_velox_router",
    "parse_item",
    "partition_of",
    "retrain_blocker",
    "ridge_solve",
    "train_mf",
]

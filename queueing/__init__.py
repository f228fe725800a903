"""The data path: per-model EDF queues, batching policies, cache, dispatch, pipeline driver."""

from ._batching import (
    AIMDBatching,
    BatchDecision,
    BatchingPolicy,
    DelayedBatching,
    FixedBatching,
    RafikiGreedyBatching,
    batching_from_dict,
)
from ._cache import PredictionCache, cache_key, key_prefix, parse_key
from ._dispatcher import Dispatcher, Listener
from ._driver import PipelineContext, PipelineFn, PipelineRunner, QueryResult
from ._inprocess import InProcessReplica, NoOpModel
from ._lineage import TracingContext, trace_pipeline
from ._stats import ArrivalEvent, BatchEvent, ModelStats, RecentService

__all__ = [
    "AIMDBatching",
    "ArrivalEvent",
    "BatchDecision",
    "BatchEvent",
    "BatchingPolicy",
    "DelayedBatching",
    "Dispatcher",
    "FixedBatching",
    "InProcessReplica",
    "Listener",
    "ModelStats",
    "NoOpModel",
    "PipelineContext",
    "PipelineFn",
    "PipelineRunner",
    "PredictionCache",
    "QueryResult",
    "RafikiGreedyBatching",
    "RecentService",
    "TracingContext",
    "batching_from_dict",
    "cache_key",
    "key_prefix",
    "parse_key",
    "trace_pipeline",
]

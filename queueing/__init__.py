"""The data path: per-model EDF queues, batching policies, admission, priorities, cache,
dispatch, pipeline driver."""

from ._admission import (
    ADMISSION_MODES,
    AdmissionConfig,
    AdmissionDecision,
    PredictedLate,
    admit,
    late_at_dispatch,
    predict_completion,
)
from ._batch_latency import BatchLatency
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
from ._priority import MAX_PRIORITY, MIN_PRIORITY, check_priority, current_priority, priority_scope
from ._stats import ArrivalEvent, BatchEvent, ModelStats, RecentService

__all__ = [
    "ADMISSION_MODES",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "AIMDBatching",
    "AdmissionConfig",
    "AdmissionDecision",
    "ArrivalEvent",
    "BatchDecision",
    "BatchEvent",
    "BatchLatency",
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
    "PredictedLate",
    "PredictionCache",
    "QueryResult",
    "RafikiGreedyBatching",
    "RecentService",
    "TracingContext",
    "admit",
    "batching_from_dict",
    "cache_key",
    "check_priority",
    "current_priority",
    "key_prefix",
    "late_at_dispatch",
    "parse_key",
    "predict_completion",
    "priority_scope",
    "trace_pipeline",
]

"""Model selection: bandit policies, ensembles with confidence, contextual state, switching."""

from ._bandits import BUILTIN_POLICIES, UCB1, EpsilonGreedy, Exp3, Exp4, StaticPolicy, make_policy
from ._checks import check_policy
from ._margin import AllowanceState, CombineAllowance
from ._policy import Combined, SelectionPolicy, WeightState, as_label, combine_votes, zero_one_loss
from ._rafiki import (
    EnsembleEnv,
    EpisodeStats,
    RafikiConfig,
    greedy_batch,
    run_baseline,
    sine_arrivals,
    sine_rate,
)
from ._rafiki_agent import RafikiAgent, RafikiTrainConfig, TrainLog
from ._rafiki_policy import RafikiPolicy
from ._service import Prediction, SelectionConfig, SelectionService, input_digest
from ._store import MemoryStore, RedisStore, SQLiteStore, StateStore, open_store
from ._switching import (
    RateEstimator,
    SwitchDecision,
    SwitchingConfig,
    SwitchingController,
    SwitchingTable,
    SwitchOption,
    Variant,
    build_switching_table,
    thread_hardware,
)
from ._switching_live import (
    RebuildDecision,
    TableInfo,
    TableRebuildConfig,
    TableRebuildPolicy,
    VariantTiming,
    scaled_profiles,
    timings_by_batch,
)

__all__ = [
    "BUILTIN_POLICIES",
    "UCB1",
    "AllowanceState",
    "CombineAllowance",
    "Combined",
    "EnsembleEnv",
    "EpisodeStats",
    "EpsilonGreedy",
    "Exp3",
    "Exp4",
    "MemoryStore",
    "Prediction",
    "RafikiAgent",
    "RafikiConfig",
    "RafikiPolicy",
    "RafikiTrainConfig",
    "RateEstimator",
    "RebuildDecision",
    "RedisStore",
    "SQLiteStore",
    "SelectionConfig",
    "SelectionPolicy",
    "SelectionService",
    "StateStore",
    "StaticPolicy",
    "SwitchDecision",
    "SwitchOption",
    "SwitchingConfig",
    "SwitchingController",
    "SwitchingTable",
    "TableInfo",
    "TableRebuildConfig",
    "TableRebuildPolicy",
    "TrainLog",
    "Variant",
    "VariantTiming",
    "WeightState",
    "as_label",
    "build_switching_table",
    "check_policy",
    "combine_votes",
    "greedy_batch",
    "input_digest",
    "make_policy",
    "open_store",
    "run_baseline",
    "scaled_profiles",
    "sine_arrivals",
    "sine_rate",
    "thread_hardware",
    "timings_by_batch",
    "zero_one_loss",
]

"""Model selection: bandit policies, ensembles with confidence, contextual state, switching."""

from ._bandits import UCB1, EpsilonGreedy, Exp3, Exp4, StaticPolicy, make_policy
from ._policy import Combined, SelectionPolicy, WeightState, as_label, combine_votes, zero_one_loss
from ._service import Prediction, SelectionConfig, SelectionService, input_digest
from ._store import MemoryStore, RedisStore, SQLiteStore, StateStore, open_store

__all__ = [
    "UCB1",
    "Combined",
    "EpsilonGreedy",
    "Exp3",
    "Exp4",
    "MemoryStore",
    "Prediction",
    "RedisStore",
    "SQLiteStore",
    "SelectionConfig",
    "SelectionPolicy",
    "SelectionService",
    "StateStore",
    "StaticPolicy",
    "WeightState",
    "as_label",
    "combine_votes",
    "input_digest",
    "make_policy",
    "open_store",
    "zero_one_loss",
]

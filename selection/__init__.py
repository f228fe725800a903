"""Model selection: bandit policies, ensembles with confidence, contextual state, switching."""

from ._bandits import UCB1, EpsilonGreedy, Exp3, Exp4, StaticPolicy, make_policy
from ._policy import Combined, SelectionPolicy, WeightState, as_label, combine_votes, zero_one_loss

__all__ = [
    "UCB1",
    "Combined",
    "EpsilonGreedy",
    "Exp3",
    "Exp4",
    "SelectionPolicy",
    "StaticPolicy",
    "WeightState",
    "as_label",
    "combine_votes",
    "make_policy",
    "zero_one_loss",
]

"""Selection policies: interface, state isolation and round trips, seeded learning behaviour."""

import json
import random

import numpy as np
import pytest

from inferline.core import ValidationError
from inferline.selection import (
    UCB1,
    EpsilonGreedy,
    Exp3,
    Exp4,
    StaticPolicy,
    WeightState,
    combine_votes,
    make_policy,
)

MODELS = ["a", "b", "c"]
ALL = [Exp3, Exp4, EpsilonGreedy, UCB1, StaticPolicy]


def _run(policy, steps, acc, seed=0):
    """Bernoulli-correct models: model i is right with probability acc[i]; returns error rate."""
    rng = np.random.default_rng(seed)
    state = policy.init()
    errors = 0
    for _ in range(steps):
        y = int(rng.integers(10))
        chosen = policy.select(state, None)
        preds = {m: (y if rng.random() < acc[m] else (y + 1) % 10) for m in chosen}
        out = policy.combine(state, None, preds).output
        errors += out != y
        state = policy.observe(state, None, y, preds)
    return errors / steps, state


@pytest.mark.parametrize("cls", ALL)
def test_state_round_trips_through_json_and_inputs_untouched(cls):
    p = cls(MODELS, rng=random.Random(1))
    _, st = _run(p, 50, {"a": 0.9, "b": 0.5, "c": 0.2})
    again = p.state_from_dict(json.loads(json.dumps(st.to_dict())))
    assert again == st
    preds = {"a": 1, "b": 2}
    snapshot = dict(preds)
    p.observe(st, None, 1, preds)
    assert preds == snapshot


@pytest.mark.parametrize("cls", ALL)
def test_same_seed_same_choices(cls):
    a = _run(cls(MODELS, rng=random.Random(5)), 200, {"a": 0.9, "b": 0.5, "c": 0.2}, seed=3)
    b = _run(cls(MODELS, rng=random.Random(5)), 200, {"a": 0.9, "b": 0.5, "c": 0.2}, seed=3)
    assert a[0] == b[0] and a[1] == b[1]


@pytest.mark.parametrize("cls", [Exp3, EpsilonGreedy, UCB1])
def test_single_model_policies_find_the_best_model(cls):
    # tolerance: after 3000 steps the best model (90%) is chosen at least 75% of the time
    err, st = _run(cls(MODELS, rng=random.Random(0)), 3000, {"a": 0.3, "b": 0.9, "c": 0.5})
    assert st.counts[1] / sum(st.counts) > 0.75
    assert err < 0.2


def test_exp4_weights_favour_accurate_models():
    err, st = _run(Exp4(MODELS, rng=random.Random(0)), 2000, {"a": 0.6, "b": 0.8, "c": 0.5})
    w = st.weights()
    assert np.argmax(w) == 1 and w[1] > 0.9
    assert err < 0.23  # close to the best model's 0.2 error


def test_exp4_small_eta_votes_as_an_ensemble():
    # with near-equal weights three independent 70% models vote to ~78% accuracy
    err, _ = _run(
        Exp4(MODELS, eta=1e-4, rng=random.Random(0)), 4000, {"a": 0.7, "b": 0.7, "c": 0.7}
    )
    assert err == pytest.approx(0.216, abs=0.025)


def test_exp3_update_matches_the_paper_formula():
    p = Exp3(["a", "b"], eta=0.5, gamma=0.0, rng=random.Random(0))
    st = p.init()
    st2 = p.observe(st, None, 1, {"a": 0})  # loss 1 on model a with p_a = 0.5
    w = st2.weights()
    expected = np.array([np.exp(-0.5 * 1 / 0.5), 1.0])
    assert w == pytest.approx(expected / expected.sum())


def test_combine_votes_confidence_counts_missing_models_as_disagreeing():
    c = combine_votes({"a": 3, "b": 3}, {"a": 0.2, "b": 0.3, "c": 0.5}, ["a", "b", "c"])
    assert (c.output, c.contributed, c.selected) == (3, 2, 3)
    assert c.confidence == pytest.approx(2 / 3)
    c = combine_votes(
        {"a": np.array([0.1, 0.9]), "b": [0.8, 0.2], "c": 1}, {"a": 1, "b": 0.1, "c": 1}, MODELS
    )
    assert c.output == 1 and c.confidence == pytest.approx(2 / 3)


def test_make_policy_round_trips_config_and_names_bad_fields():
    p = Exp3(MODELS, eta=0.1, gamma=0.2)
    q = make_policy(json.loads(json.dumps(p.config())))
    assert isinstance(q, Exp3) and (q.eta, q.gamma, q.models) == (0.1, 0.2, tuple(MODELS))
    with pytest.raises(ValidationError, match="policy"):
        make_policy({"policy": "nope", "models": MODELS})
    with pytest.raises(ValidationError, match="eta"):
        Exp3(MODELS, eta=-1)
    with pytest.raises(ValidationError, match="models"):
        Exp4(["a", "a"])
    with pytest.raises(ValidationError, match="missing_loss"):
        Exp3(MODELS, missing_loss=-1)


def test_a_state_learned_for_other_models_is_migrated():
    """Models added to an app since its state was learned start level with the best one;
    removed ones are dropped; what the kept ones learned is kept (it was a 422 before)."""
    old = WeightState(("a", "b", "gone"), (0.0, -3.0, -1.0), (5, 7, 2), (0.0, 4.0, 1.0), 14)
    p = Exp3(["b", "a", "new"])
    st = p.state_from_dict(old.to_dict())
    assert st.models == ("b", "a", "new")
    assert st.log_weights == (-3.0, 0.0, 0.0)
    assert st.counts == (7, 5, 0) and st.total_loss == (4.0, 0.0, 0.0) and st.steps == 14
    assert UCB1(["a", "new"]).select(UCB1(["a", "new"]).state_from_dict(old.to_dict()), None) == [
        "new"
    ]  # the untried model first

"""Rafiki: greedy batching rule (Algorithm 3), the ensemble environment, baselines, actor-critic."""

import json

import numpy as np
import pytest

from inferline.core import ValidationError
from inferline.selection._rafiki import (
    EnsembleEnv,
    RafikiAgent,
    RafikiConfig,
    greedy_batch,
    run_baseline,
    sine_arrivals,
)

LAT = [{16: 0.07, 32: 0.12, 64: 0.23}, {16: 0.10, 32: 0.18, 64: 0.34}]
ACC = {(0,): 0.78, (1,): 0.80, (0, 1): 0.83}
CFG = RafikiConfig((16, 32, 64), tau_s=1.0)


def test_greedy_batch_follows_algorithm_3():
    lat = {16: 0.07, 32: 0.12, 64: 0.23}.__getitem__
    sizes = (16, 32, 64)
    assert greedy_batch(70, 0.0, sizes, lat, 1.0, 0.1) == 64  # full largest batch at once
    assert greedy_batch(40, 0.0, sizes, lat, 1.0, 0.1) == 0  # wait: oldest not urgent
    assert greedy_batch(40, 0.79, sizes, lat, 1.0, 0.1) == 32  # 0.12 + 0.79 + 0.1 >= 1
    assert greedy_batch(0, 5.0, sizes, lat, 1.0, 0.1) == 0


def test_sine_arrivals_peak_and_fraction_above_reference():
    rng = np.random.default_rng(0)
    tau = 0.01  # period 5 s
    t = sine_arrivals(1000.0, tau, 50.0, rng)
    counts, _ = np.histogram(t, bins=np.arange(0, 50.01, 0.25))
    rates = counts / 0.25
    # tolerance: Poisson + 10% noise on 250-arrival bins
    assert 0.10 < np.mean(rates > 1000) < 0.30
    assert rates.max() == pytest.approx(1100, rel=0.2)


def test_every_arrival_is_served_once_and_rewards_follow_eq_7():
    arr = sine_arrivals(150.0, CFG.tau_s, 30.0, np.random.default_rng(1))
    env = EnsembleEnv(LAT, ACC, CFG, arr)
    for mode in ("sync", "async"):
        st = run_baseline(env, mode)
        assert st.served + st.dropped == arr.size
        # Eq. 7 summed over batches: sum acc*(n - beta*overdue)
        expect = sum(acc * (n - CFG.beta * od) for _, n, od, acc in st.timeline)
        assert st.reward == pytest.approx(expect)
    sync, asyn = run_baseline(env, "sync"), run_baseline(env, "async")
    assert sync.accuracy == pytest.approx(0.83) and asyn.accuracy < 0.81
    assert sync.summary()["mean_models_per_batch"] == 2.0


def test_validation_and_config_round_trip():
    assert RafikiConfig.from_dict(json.loads(json.dumps(CFG.to_dict()))) == CFG
    with pytest.raises(ValidationError, match="subset_accuracy"):
        EnsembleEnv(LAT, {(0,): 0.7}, CFG, np.array([0.0]))
    with pytest.raises(ValidationError, match="latency"):
        EnsembleEnv([{16: 0.1}], {(0,): 0.7}, CFG, np.array([0.0]))


def test_actor_critic_learns_to_beat_its_untrained_self():
    arr = sine_arrivals(250.0, CFG.tau_s, 60.0, np.random.default_rng(2))
    env = EnsembleEnv(LAT, ACC, CFG, arr)
    agent = RafikiAgent(env.state_dim, len(env.actions), seed=0)
    before = agent.run(env, greedy=False).reward
    agent.train(env, episodes=6)
    after = agent.run(env, greedy=True)
    assert after.served == arr.size
    assert after.reward > before  # seeded; the trained policy earns more Eq. 7 reward

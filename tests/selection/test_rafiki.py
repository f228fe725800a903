"""Rafiki: greedy batching rule (Algorithm 3), the ensemble environment, baselines, actor-critic."""

import json

import numpy as np
import pytest

from inferline.core import ValidationError
from inferline.selection import (
    EnsembleEnv,
    RafikiAgent,
    RafikiConfig,
    RafikiTrainConfig,
    greedy_batch,
    run_baseline,
    sine_arrivals,
    sine_rate,
)

LAT = [{16: 0.07, 32: 0.12, 64: 0.23}, {16: 0.10, 32: 0.18, 64: 0.34}]
ACC = {(0,): 0.78, (1,): 0.80, (0, 1): 0.83}
ACC_RL = {(0,): 0.78, (1,): 0.80, (0, 1): 0.86}
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
        expect = sum(acc * (n - CFG.beta * od) for _, n, od, acc, _ in st.timeline)
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


def test_action_mask_keeps_subsets_with_an_idle_model():
    env = EnsembleEnv(LAT, ACC, CFG, np.array([0.0, 0.001, 0.002]))
    env.start()
    assert env.action_mask().all()  # both idle
    env.step(env.actions.index(((0,), 16)))  # model 0 busy now, model 1 idle
    mask = env.action_mask()
    for (subset, _), ok in zip(env.actions, mask, strict=True):
        assert ok == (1 in subset)


def test_sine_arrivals_with_period_and_phase():
    rng = np.random.default_rng(3)
    t = sine_arrivals(200.0, 1.0, 50.0, rng, period_s=100.0, start_s=10.0)
    assert t[0] >= 10.0 and t[-1] < 60.0 and np.all(np.diff(t) >= 0)
    expect = sum(sine_rate(200.0, 10.0 + s, 100.0) for s in np.arange(0, 50, 0.01)) * 0.01
    assert t.size == pytest.approx(expect, rel=0.05)  # tolerance: Poisson + noise, ~9000 arrivals
    assert sine_rate(200.0, 25.0, 100.0) == pytest.approx(220.0)  # peak 1.1 r_ref


def test_train_config_round_trip_and_validation():
    c = RafikiTrainConfig(lr=3e-4, n_envs=4)
    assert RafikiTrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValidationError, match="gamma_per_tau"):
        RafikiTrainConfig(gamma_per_tau=0.0)


def _rl_env(seed, period=100.0, random_phase=False):
    start = float(np.random.default_rng(seed + 7).uniform(0, period)) if random_phase else 0.0
    arr = sine_arrivals(
        188.0, CFG.tau_s, period, np.random.default_rng(seed), period_s=period, start_s=start
    )
    return EnsembleEnv(LAT, ACC_RL, CFG, arr)


def test_actor_critic_learns_to_beat_its_untrained_self_and_both_baselines():
    # r_ref = 188 q/s: what the two models sustain together on batches of 64 (sync capacity),
    # so synchronous ensembles overload at the sine's peak while single models keep up.
    test, val = _rl_env(0), _rl_env(1)
    agent = RafikiAgent(test.state_dim, len(test.actions), seed=0, n_steps=32)
    before = agent.run(test, greedy=False).reward
    log = agent.train(
        lambda i: _rl_env(100 + i, random_phase=True), updates=200, validate=val, validate_every=20
    )
    assert log.updates == 200 and log.best_update is not None and log.episodes
    after = agent.run(test, greedy=True)
    assert after.served == test.arrivals.size
    sync, asyn = run_baseline(test, "sync"), run_baseline(test, "async")
    # seeded; measured 9210 vs untrained 9012, sync 5210, async 8629 (Eq. 7 reward)
    assert after.reward > before
    assert after.reward > sync.reward and after.reward > asyn.reward
    # adaptive: fewer models per batch where the arrival rate is high than where it is low
    rate = np.array([sine_rate(188.0, t, 100.0) for t, *_ in after.timeline])
    models = np.array([m for *_, m in after.timeline])
    hi, lo = models[rate > 188.0].mean(), models[rate < 120.0].mean()
    assert hi < lo

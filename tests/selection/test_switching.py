"""Model switching: rate estimation, effective-accuracy table from the estimator, the switching rule."""

import itertools
import json

import numpy as np
import pytest

from inferline.core import Profiles, ValidationError
from inferline.selection import (
    RateEstimator,
    SwitchingConfig,
    SwitchingController,
    SwitchingTable,
    Variant,
    build_switching_table,
)

# Three variants: accurate/slow to cheap/fast; each profiled with 1 and 2 threads.
PROFILES = Profiles.from_latencies(
    {
        "big": {"cpu": {1: 0.040}, "cpu-t2": {1: 0.024}},
        "mid": {"cpu": {1: 0.015}, "cpu-t2": {1: 0.009}},
        "small": {"cpu": {1: 0.004}, "cpu-t2": {1: 0.003}},
    }
)
VARIANTS = [Variant("big", 0.97), Variant("mid", 0.92), Variant("small", 0.85)]
CFG = SwitchingConfig(
    deadline_s=0.1, core_budget=2, rates_qps=(10, 30, 45, 80, 150, 300, 450), sim_queries=1500
)


@pytest.fixture(scope="module")
def table():
    return build_switching_table(VARIANTS, PROFILES, CFG)


def test_rate_estimator_uses_oldest_and_youngest_of_window():
    est = RateEstimator(window=5).add([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert est.times == (0.1, 0.2, 0.3, 0.4, 0.5)
    assert est.rate() == pytest.approx(10.0)
    assert est.rate(now_s=2.1) == pytest.approx(2.0)  # a lull lowers the estimate
    assert RateEstimator().rate() == 0.0


def test_table_has_every_split_of_the_core_budget(table):
    opts = {(o.variant, o.replicas, o.threads) for o in table.options}
    assert opts == {(v, 2, 1) for v in ("big", "mid", "small")} | {
        (v, 1, 2) for v in ("big", "mid", "small")
    }
    assert SwitchingTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table


def test_meet_probability_falls_with_load(table):
    for row in table.meet:
        assert all(a >= b - 0.02 for a, b in itertools.pairwise(row))  # tolerance: sampling noise
    big2 = next(i for i, o in enumerate(table.options) if o.variant == "big" and o.replicas == 2)
    assert table.meet[big2][0] == pytest.approx(1.0)
    assert table.meet[big2][-1] < 0.1  # 450 q/s is far above big's 50 q/s capacity


@pytest.mark.parametrize("rule", ["effective", "paper"])
def test_controller_switches_to_cheaper_variants_as_load_rises(table, rule):
    ctl = SwitchingController(
        table, SwitchingConfig(**{**CFG.to_dict(), "rates_qps": CFG.rates_qps, "rule": rule})
    )
    picks = []
    for rate in (5.0, 40.0, 140.0, 420.0):
        times = np.arange(64) / rate
        d = ctl.decide(float(times[-1]), RateEstimator().add(times))
        picks.append(d.option.variant)
        assert d.reason and d.rate_qps == pytest.approx(rate, rel=0.05)
    assert picks[0] == "big" and picks[-1] == "small"
    order = {"big": 0, "mid": 1, "small": 2}
    assert [order[p] for p in picks] == sorted(order[p] for p in picks)


def test_effective_rule_never_worse_than_any_fixed_option(table):
    ctl = SwitchingController(table, CFG)
    for rate in (10.0, 45.0, 150.0, 450.0):
        times = np.arange(64) / rate
        d = ctl.decide(float(times[-1]), RateEstimator().add(times))
        best_fixed = max(table.effective_accuracy(i, rate) for i in range(len(table.options)))
        assert d.effective_accuracy == pytest.approx(best_fixed)


def test_config_validation_and_round_trip():
    assert SwitchingConfig.from_dict(json.loads(json.dumps(CFG.to_dict()))) == CFG
    with pytest.raises(ValidationError, match="rule"):
        SwitchingConfig(deadline_s=1, core_budget=1, rule="x")
    with pytest.raises(ValidationError, match="accuracy"):
        Variant("v", 1.5)

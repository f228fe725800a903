"""Algorithm 1's replicas x threads choice: among the feasible splits of the chosen variant, the
one with the lowest estimated P99 (not the first one listed)."""

import pytest

from inferline.selection import (
    RateEstimator,
    SwitchingConfig,
    SwitchingController,
    SwitchingTable,
    SwitchOption,
)

CFG = SwitchingConfig(deadline_s=0.1, core_budget=2, rates_qps=(10.0, 100.0))


def _table() -> SwitchingTable:
    # "big" has two splits that both meet 100 ms at 10 q/s; the one listed first has the higher
    # P99 (90 ms vs 40 ms). At 100 q/s only the 2-thread split of "big" is feasible.
    return SwitchingTable(
        options=(
            SwitchOption("big", 2, 1),
            SwitchOption("big", 1, 2),
            SwitchOption("small", 2, 1),
        ),
        accuracy={"big": 0.97, "small": 0.85},
        rates_qps=(10.0, 100.0),
        meet=((1.0, 0.6), (1.0, 0.995), (1.0, 1.0)),
        p99_s=((0.090, 0.400), (0.040, 0.095), (0.005, 0.010)),
    )


def _at(rate: float) -> RateEstimator:
    # arrivals exactly 1/rate apart
    return RateEstimator(8).add([i / rate for i in range(8)])


@pytest.mark.parametrize("rule", ["paper", "effective"])
def test_the_lowest_p99_split_is_chosen_among_feasible_ones(rule):
    ctl = SwitchingController(_table(), SwitchingConfig(**{**CFG.to_dict(), "rule": rule}))
    d = ctl.decide(7 / 10.0, _at(10.0))
    # the first feasible split (R2xT1, P99 90 ms) was chosen before; Algorithm 1 wants R1xT2
    assert (d.option.variant, d.option.replicas, d.option.threads) == ("big", 1, 2)


def test_paper_rule_falls_to_the_cheaper_variant_only_when_no_split_is_feasible():
    cfg = SwitchingConfig(**{**CFG.to_dict(), "rule": "paper"})
    t = _table()
    ctl = SwitchingController(t, cfg)
    assert ctl.decide(7 / 100.0, _at(100.0)).option == SwitchOption("big", 1, 2)
    # make big's 2-thread split infeasible too: the most accurate feasible variant is small
    slow = SwitchingTable(
        t.options, t.accuracy, t.rates_qps, t.meet, (t.p99_s[0], (0.040, 0.150), t.p99_s[2])
    )
    assert SwitchingController(slow, cfg).decide(7 / 100.0, _at(100.0)).option.variant == "small"

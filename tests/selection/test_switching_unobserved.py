"""The live switching table's variants that did not serve (issue 47 target, task 2): with
``rebuild_unobserved: "common"`` a warm spare without enough live batches is scaled by the
observed variants' common factor (a machine's load slows all its CPU variants alike); with
``"keep"`` it keeps the factor it had. Pure policy, injected clock (the ``now_s`` argument)."""

from __future__ import annotations

import math

import pytest

from inferline.core import Profiles, ValidationError
from inferline.deploy._switching_serve import ServeSwitching
from inferline.selection import TableRebuildConfig, TableRebuildPolicy, Variant, VariantTiming

BASE = Profiles.from_latencies(
    {"f200": {"cpu": {1: 0.025}}, "f100": {"cpu": {1: 0.020}}, "f30": {"cpu": {1: 0.010}}}
)
HW = {"f200": "cpu", "f100": "cpu", "f30": "cpu"}


def policy(unobserved: str, every_s: float = 2.0) -> TableRebuildPolicy:
    cfg = TableRebuildConfig(every_s=every_s, window_s=5.0, min_batches=10, unobserved=unobserved)
    return TableRebuildPolicy(cfg, BASE)


def t(n: int, s: float) -> dict[int, VariantTiming]:
    return {1: VariantTiming(n, s)}


def test_common_scales_the_spares_by_the_serving_variants_factor():
    # f200 serves at twice its start-up figure; f30 ran 3 batches (too few), f100 none
    live = {"f200": t(40, 0.050), "f30": t(3, 0.010)}
    p = policy("common")
    assert p.decide(1.9, 0.0, {}, live, HW, 10.0, 80.0) is None  # 2 s not yet passed
    d = p.decide(2.0, 0.0, {}, live, HW, 10.0, 80.0)
    assert d is not None
    assert d.factors == pytest.approx({"f200": 2.0, "f100": 2.0, "f30": 2.0})
    assert "f200 service x1.00 -> x2.00 (40 batches on cpu)" in d.changes
    assert "f30 service x1.00 -> x2.00 (common factor of f200)" in d.changes
    # "keep": the same window moves only the variant that served
    k = policy("keep").decide(2.0, 0.0, {}, live, HW, 10.0, 80.0)
    assert k is not None and k.factors == pytest.approx({"f200": 2.0})
    assert "f30" not in k.changes and "f100" not in k.changes


def test_common_factor_is_the_count_weighted_geometric_mean_of_the_observed():
    # f200 at x2 over 30 batches, f30 at x0.5 over 10: 2 ** 0.75 * 0.5 ** 0.25 = 2 ** 0.5
    live = {"f200": t(30, 0.050), "f30": t(10, 0.005)}
    d = policy("common").decide(5.0, 0.0, {}, live, HW, 10.0, 80.0)
    assert d is not None
    assert d.factors["f200"] == pytest.approx(2.0)
    assert d.factors["f30"] == pytest.approx(0.5)  # observed: its own factor, not the common
    assert d.factors["f100"] == pytest.approx(math.sqrt(2.0))
    assert "(common factor of f200, f30)" in d.changes


def test_a_spare_follows_the_load_back_and_nothing_observed_changes_nothing():
    p = policy("common")
    built = {"f200": 2.0, "f100": 2.0, "f30": 2.0}
    # the load went: f200 back at its profile, so the spares come back with it
    back = p.decide(10.0, 4.0, built, {"f200": t(20, 0.025)}, HW, 10.0, 80.0)
    assert back is not None and back.factors == pytest.approx({v: 1.0 for v in HW})
    # within the threshold of what the table was built with: not due
    assert p.decide(10.0, 4.0, built, {"f200": t(20, 0.052)}, HW, 10.0, 80.0) is None
    # no variant with enough batches: every factor stays, nothing is due
    assert p.decide(10.0, 4.0, built, {"f200": t(9, 0.2)}, HW, 10.0, 80.0) is None


def test_the_option_is_validated_and_round_trips_the_switching_file():
    with pytest.raises(ValidationError, match=r"switching\.rebuild_unobserved"):
        TableRebuildConfig(unobserved="guess")
    vs = (Variant("f200", 0.82), Variant("f30", 0.74))
    with pytest.raises(ValidationError, match=r"switching\.rebuild_unobserved"):
        ServeSwitching("digits", "f200", vs, "p.json", rebuild_unobserved="all")
    cfg = ServeSwitching("digits", "f200", vs, "p.json", rebuild_unobserved="keep")
    again = ServeSwitching.from_dict(cfg.to_dict())
    assert again == cfg and again.rebuild_config().unobserved == "keep"
    assert ServeSwitching("digits", "f200", vs, "p.json").rebuild_config().unobserved == "common"

"""`inferline calibrate`'s arithmetic: profiles scaled to live service quantiles."""

from __future__ import annotations

import math

import pytest

from inferline.core import BatchProfile, Profiles, ValidationError, WakeProfile
from inferline.measure import calibrate_profiles, live_service_from_admin
from inferline.queueing import RecentService


def _profiles(statistic: str = "mean") -> Profiles:
    def bp(b: int) -> BatchProfile:
        p50, p99 = 0.001 * (1 + b), 0.002 * (1 + b)
        lat = {"mean": 1.2 * p50, "p50": p50, "p99": p99}[statistic]
        return BatchProfile(lat, p50, p99, 0.0001, 50)

    pair = {b: bp(b) for b in (1, 2, 4)}
    wake = WakeProfile((0.01, 0.1), (0.0005, 0.001))
    return Profiles(
        {"a": {"cpu": pair, "gpu": pair}, "b": {"cpu": pair}},
        {"a": {"cpu": wake, "gpu": wake}, "b": {"cpu": wake}},
    )


def test_factors_are_batch_weighted_log_means_of_the_ratios() -> None:
    prof = _profiles()
    live = {
        "a": {
            1: RecentService(300, 0.002 * 2.0, 0.004 * 3.0),  # x2 median, x3 P99
            2: RecentService(100, 0.003 * 4.0, 0.006 * 3.0),  # x4 median, x3 P99
            4: RecentService(9, 1.0, 1.0),  # too few batches: ignored
        }
    }
    new, rows = calibrate_profiles(prof, {"a": "cpu"}, live, min_batches=10)
    (row,) = rows
    assert row.calibrated and row.sizes == (1, 2) and row.batches == 400
    f50 = math.exp((300 * math.log(2.0) + 100 * math.log(4.0)) / 400)
    assert row.p50_factor == pytest.approx(f50) and row.p99_factor == pytest.approx(3.0)
    for b in (1, 2, 4):  # every profiled size, also the one live traffic did not reach
        old, got = prof.batch_profile("a", "cpu", b), new.batch_profile("a", "cpu", b)
        assert got.p50_s == pytest.approx(old.p50_s * f50)
        assert got.p99_s == pytest.approx(old.p99_s * 3.0)
    # the other hardware and the other model are untouched, with their wake-up extras
    assert new.models["a"]["gpu"] == prof.models["a"]["gpu"]
    assert new.models["b"] == prof.models["b"]
    assert new.wake("a", "gpu") is not None and new.wake("b", "cpu") is not None
    # the calibrated pair's are dropped: the live times contain the wake-ups already
    assert new.wake("a", "cpu") is None
    assert Profiles.from_dict(new.to_dict()) == new


@pytest.mark.parametrize(
    ("statistic", "expect"),
    [("p50", "f50"), ("p99", "f99"), ("mean", "between")],
)
def test_latency_s_moves_with_the_quantile_it_sits_at(statistic: str, expect: str) -> None:
    prof = _profiles(statistic)
    live = {"a": {1: RecentService(100, 0.002 * 1.5, 0.004 * 4.0)}}
    new, _ = calibrate_profiles(prof, {"a": "cpu"}, live)
    old, got = prof.batch_profile("a", "cpu", 1), new.batch_profile("a", "cpu", 1)
    factor = got.latency_s / old.latency_s
    if expect == "f50":
        assert factor == pytest.approx(1.5)
    elif expect == "f99":
        assert factor == pytest.approx(4.0)
    else:  # 1.2 x the median: log-linear between the two factors, nearer the median's
        u = math.log(1.2) / math.log(2.0)
        assert factor == pytest.approx(1.5 ** (1 - u) * 4.0**u)
        assert 1.5 < factor < 4.0


def test_p99_stays_at_least_the_median() -> None:
    prof = _profiles()
    live = {"a": {1: RecentService(100, 0.002 * 3.0, 0.004 * 0.5)}}  # median up, tail down
    new, _ = calibrate_profiles(prof, {"a": "cpu"}, live)
    for b in (1, 2, 4):
        got = new.batch_profile("a", "cpu", b)
        assert got.p99_s >= got.p50_s


def test_what_cannot_be_calibrated_says_why() -> None:
    prof = _profiles()
    live = {
        "a": {1: RecentService(20, 0.004, 0.008)},  # under min_batches
        "b": {8: RecentService(500, 0.02, 0.03)},  # beyond the largest profiled size
    }
    new, rows = calibrate_profiles(prof, {"a": "cpu", "b": "cpu", "c": "cpu", "a2": "tpu"}, live)
    notes = {r.model: r.note for r in rows}
    assert "no batch size with 50+ live batches (20 in all)" in notes["a"]
    assert "(500 in all)" in notes["b"]
    assert notes["c"] == "not profiled on 'cpu'" and notes["a2"] == "not profiled on 'tpu'"
    assert not any(r.calibrated for r in rows)
    assert new == prof
    with pytest.raises(ValidationError, match="min_batches"):
        calibrate_profiles(prof, {"a": "cpu"}, live, min_batches=0)


def test_live_service_from_the_admin_endpoint() -> None:
    body = {
        "a": {"queue": {"service_recent_by_batch": {"1": {"batches": 3, "p50_s": 1, "p99_s": 2}}}},
        "b": {"queue": {"error": "no queue"}},  # skipped
        "c": {"backend": {}},
    }
    assert live_service_from_admin(body) == {"a": {1: RecentService(3, 1.0, 2.0)}}
    with pytest.raises(ValidationError, match=r"a\.queue\.service_recent_by_batch"):
        live_service_from_admin({"a": {"queue": {"service_recent_by_batch": {"x": {}}}}})
    with pytest.raises(ValidationError, match="/admin/models"):
        live_service_from_admin([1, 2])

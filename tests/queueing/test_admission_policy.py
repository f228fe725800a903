"""Admission by predicted completion and Clockwork's dispatch rule as pure functions: numbers
in (the clock is ``now``), decisions out; the batch-latency learner; the config's round trip."""

from __future__ import annotations

import json
import math

import pytest

from inferline.core.errors import OverloadedError, ValidationError
from inferline.queueing import (
    AdmissionConfig,
    BatchLatency,
    PredictedLate,
    admit,
    late_at_dispatch,
    predict_completion,
)

ON = AdmissionConfig("predicted", buffer_s=0.0)


def lat(b: int) -> float:
    """The issue's sleep model: 10 ms per batch plus 1 ms per item."""
    return 0.010 + 0.001 * b


def test_prediction_walks_the_queue_batch_by_batch() -> None:
    # one free replica, batches of 8: position 0..7 in the first batch (18 ms), 8..15 next
    assert predict_completion(0.0, 0, 20, [0.0], 8, lat) == pytest.approx(0.018)
    assert predict_completion(0.0, 7, 20, [0.0], 8, lat) == pytest.approx(0.018)
    assert predict_completion(0.0, 8, 20, [0.0], 8, lat) == pytest.approx(0.036)
    # the third batch holds what is left (4): 36 + 14 ms
    assert predict_completion(0.0, 19, 20, [0.0], 8, lat) == pytest.approx(0.050)
    # a replica busy until 5 ms starts later; a past free time means now
    assert predict_completion(1.0, 0, 1, [1.005], 8, lat) == pytest.approx(1.016)
    assert predict_completion(1.0, 0, 1, [0.5], 8, lat) == pytest.approx(1.011)
    # two replicas: the second batch goes to the other one, free at 10 ms
    assert predict_completion(0.0, 8, 16, [0.0, 0.010], 8, lat) == pytest.approx(0.028)


def test_nothing_to_predict_with() -> None:
    assert predict_completion(0.0, 0, 1, [], 8, lat) is None  # no replica
    assert predict_completion(0.0, 0, 1, [0.0], 8, lambda b: None) is None
    d = admit(ON, 0.0, 0.001, 0, 1, [], 8, lat)
    assert d.admitted and d.predicted == math.inf  # admits what it cannot predict


def test_admit_and_refuse_at_the_boundary() -> None:
    # the 9th query (position 8) is alone in the second batch: 18 + 11 = 29 ms; a deadline
    # of exactly that admits it, a hair earlier refuses it
    assert admit(ON, 0.0, 0.029, 8, 9, [0.0], 8, lat).admitted
    d = admit(ON, 0.0, 0.0289, 8, 9, [0.0], 8, lat)
    assert not d.admitted
    assert d.predicted == pytest.approx(0.029)
    assert d.late_by_s == pytest.approx(0.0001)
    assert d.retry_after_s == pytest.approx(0.0001)


def test_the_buffer_moves_the_boundary() -> None:
    cfg = AdmissionConfig("predicted", buffer_s=0.002)
    assert admit(cfg, 0.0, 0.020, 0, 1, [0.0], 8, lat).admitted  # 11 ms <= 18 ms
    assert not admit(cfg, 0.0, 0.0125, 0, 1, [0.0], 8, lat).admitted  # 11 > 10.5
    d = admit(cfg, 0.0, 0.0125, 0, 1, [0.0], 8, lat)
    assert d.late_by_s == pytest.approx(0.011 - 0.0125)  # vs the client's deadline
    assert d.retry_after_s == pytest.approx(0.011 - 0.0105)  # vs the internal one


def test_off_admits_everything() -> None:
    assert admit(AdmissionConfig(), 0.0, -1.0, 100, 200, [5.0], 8, lat).admitted
    assert not late_at_dispatch(AdmissionConfig(), 10.0, 0.0, 1.0)


def test_infinite_deadline_is_admitted() -> None:
    assert admit(ON, 0.0, math.inf, 1000, 1001, [0.0], 1, lat).admitted


def test_dispatch_rule_drops_what_cannot_finish_with_this_batch() -> None:
    # replica free now (1.0), this batch takes 18 ms: a deadline before 1.018 is dropped
    assert late_at_dispatch(ON, 1.0, 1.0179, 0.018)
    assert not late_at_dispatch(ON, 1.0, 1.018, 0.018)
    cfg = AdmissionConfig("predicted", buffer_s=0.002)
    assert late_at_dispatch(cfg, 1.0, 1.019, 0.018)  # 1.017 internal deadline
    assert not late_at_dispatch(cfg, 1.0, 1.019, None)  # no estimate: never drops


def test_batch_latency_is_the_median_plus_the_pooled_p99_tail() -> None:
    bl = BatchLatency(window=100, min_samples=5)
    assert bl.estimate(8) is None
    for _ in range(4):
        bl.observe(8, 0.018)
    assert bl.estimate(8) is None  # not enough samples yet
    for _ in range(195):
        bl.observe(8, 0.018)
    bl.observe(8, 0.030)  # one stall in 100: the P99 of the excess stays 0, not the max
    assert bl.estimate(8) == pytest.approx(0.018)
    for _ in range(100):
        bl.observe(4, 0.014)  # other sizes' batches refresh the pooled tail too
    assert bl.estimate(8) == pytest.approx(0.018) and bl.estimate(4) == pytest.approx(0.014)
    for i in range(100):
        bl.observe(4, 0.014 + (0.003 if i % 10 == 0 else 0.0))  # 10% run 3 ms over
    assert bl.estimate(8) == pytest.approx(0.021)  # the median plus the tail's P99


def test_batch_latency_for_sizes_not_measured() -> None:
    bl = BatchLatency(min_samples=1)
    bl.observe(4, 0.014)
    assert bl.estimate(2) == pytest.approx(0.014)  # the smallest measured size above
    assert bl.estimate(8) == pytest.approx(0.028)  # proportional from the only one
    bl.observe(8, 0.018)
    assert bl.estimate(16) == pytest.approx(0.018 + 0.001 * 8)  # the line through two
    withprof = BatchLatency(min_samples=1, profile=lat)
    assert withprof.estimate(3) == pytest.approx(0.013)  # the profile until measured
    withprof.observe(3, 0.05)
    assert withprof.estimate(3) == pytest.approx(0.05)  # then the live P99
    assert withprof.estimate(8) == pytest.approx(0.018)  # past it: the profile


def test_config_round_trip_and_validation() -> None:
    cfg = AdmissionConfig("predicted", buffer_s=0.003, min_samples=3, window=64)
    assert AdmissionConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert AdmissionConfig().enabled is False and cfg.enabled
    for bad in ({"mode": "on"}, {"buffer_s": -1.0}, {"min_samples": 0}, {"window": True}):
        with pytest.raises(ValidationError):
            AdmissionConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as ei:
        AdmissionConfig.from_dict({"mode": "predicted", "extra": 1})
    assert ei.value.field == "admission"


def test_predicted_late_is_an_overload_with_a_retry_hint() -> None:
    e = PredictedLate("m", "admission", 0.0123, 0.0145)
    assert isinstance(e, OverloadedError) and e.model == "m"
    assert e.reason == "predicted_late" and e.retry_after_s == pytest.approx(0.0145)
    assert "12.3 ms after its deadline" in str(e)
    assert PredictedLate("m", "dispatch", 0.001, -1.0).reason == "dropped_late"
    assert PredictedLate("m", "dispatch", 0.001, -1.0).retry_after_s == 0.0

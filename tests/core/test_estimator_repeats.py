"""Repeated calls: a query that calls a model k times (``Pipeline.visits``) puts k sequential
queue entries on it, in the format, the draws and the estimator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    ValidationError,
    draw_visits,
    simulate,
)

PIPE = Pipeline("p", ("a", "b"), (("a", "b"),), {"b": 0.5}, {"a": 2.0, "b": 1.5})


def test_visits_round_trip_and_old_files_stay_valid() -> None:
    d = json.loads(json.dumps(PIPE.to_dict()))
    assert d["visits"] == {"a": 2.0, "b": 1.5}
    assert Pipeline.from_dict(d) == PIPE
    old = {"format": "inferline.pipeline/1", "name": "x", "models": ["a"], "edges": []}
    p = Pipeline.from_dict(old)
    assert p.visits_of("a") == 1.0 and "visits" not in p.to_dict()
    assert PIPE.calls("a") == 2.0 and PIPE.calls("b") == 0.75


@pytest.mark.parametrize("bad", [0.5, 0.0, -1.0, 1000.0])
def test_visits_below_one_or_absurd_are_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match=r"visits\.a"):
        Pipeline("x", ("a",), (), {}, {"a": bad})
    with pytest.raises(ValidationError, match="visits"):
        Pipeline("x", ("a",), (), {}, {"z": 2.0})


def test_draws_count_calls_and_keep_the_visit_draws() -> None:
    plain = Pipeline("p", ("a", "b"), (("a", "b"),), {"b": 0.5})
    vis = draw_visits(PIPE, 4000, 3)
    np.testing.assert_array_equal(vis > 0, draw_visits(plain, 4000, 3) > 0)
    assert set(np.unique(vis[:, 0])) == {2}
    b = vis[:, 1][vis[:, 1] > 0]
    assert set(np.unique(b)) == {1, 2}
    assert abs(b.mean() - 1.5) < 0.05


def test_two_sequential_calls_by_hand() -> None:
    """One replica, latency 1 s alone and 1.5 s for a batch of 2; queries at 0 and 0.5.

    q0's first call runs [0, 1]; at 1 its second call and q1's first are queued: one batch
    [1, 2.5] (EDF: q0 first); q0 is done at 2.5; q1's second call runs [2.5, 3.5]."""
    p = Pipeline("one", ("a",), (), {}, {"a": 2})
    prof = Profiles.from_latencies({"a": {"cpu": {1: 1.0, 2: 1.5}}})
    res = simulate(p, {"a": ModelConfig("cpu", 2, 1)}, prof, np.array([0.0, 0.5]))
    np.testing.assert_array_equal(res.latencies_s, [2.5, 3.0])
    assert res.models["a"].visits == 4 and res.models["a"].batches == 3
    assert res.models["a"].mean_batch_size == pytest.approx(4 / 3)
    # batch size 1: the second call waits behind nobody (EDF puts q0 ahead of q1)
    res1 = simulate(p, {"a": ModelConfig("cpu", 1, 1)}, prof, np.array([0.0, 0.5]))
    np.testing.assert_array_equal(res1.latencies_s, [2.0, 3.5])


def test_children_start_after_the_last_call_and_hops_count_per_call() -> None:
    p = Pipeline("ab", ("a", "b"), (("a", "b"),), {}, {"a": 3})
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.25}}, "b": {"cpu": {1: 0.5}}})
    cfg = {"a": ModelConfig("cpu", 1, 1), "b": ModelConfig("cpu", 1, 1)}
    res = simulate(p, cfg, prof, np.array([0.0]), options=EstimatorOptions(hop_overhead_s=0.125))
    assert res.latencies_s[0] == 4 * 0.125 + 3 * 0.25 + 0.5


def test_k_calls_need_k_times_the_capacity() -> None:
    """At 3 q/s with 0.25 s per call, one replica keeps up with 1 call per query (75 %) but
    not with 2 (150 %); two replicas do."""
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.25}}})
    arr = np.arange(300) / 3.0
    one = Pipeline("one", ("a",))
    two = Pipeline("two", ("a",), (), {}, {"a": 2})
    r1 = simulate(one, {"a": ModelConfig("cpu", 1, 1)}, prof, arr)
    r2 = simulate(two, {"a": ModelConfig("cpu", 1, 1)}, prof, arr)
    r3 = simulate(two, {"a": ModelConfig("cpu", 1, 2)}, prof, arr)
    assert r1.percentile(99) == 0.25
    assert r2.percentile(99) > 10.0
    assert r3.percentile(99) <= 0.75

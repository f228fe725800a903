"""Planning across a fleet's servers (``core/planning/_servers.py``): servers as planner
nodes, the plan's placement per model, and the hop to each server added to the profiles."""

from __future__ import annotations

import numpy as np
import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    ModelConfig,
    Pipeline,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    place_on_nodes,
    plan_inferline,
)
from inferline.core.planning import add_hops, hop_extras, server_nodes, shares_by_model


def test_servers_are_nodes_and_the_placement_reads_per_model() -> None:
    nodes = server_nodes([("tri://a", {"cpu": 1, "tpu-x": 3}), ("tri://b", {"cpu": 2})], ["cpu"])
    assert [(n.name, dict(n.hardware)) for n in nodes] == [
        ("tri://a", {"cpu": 1}),  # a kind the catalog does not price is dropped
        ("tri://b", {"cpu": 2}),
    ]
    configs = {"pre": ModelConfig("cpu", 4, 2), "cls": ModelConfig("cpu", 4, 1)}
    placed = place_on_nodes(configs, DEFAULT_CATALOG, PlannerOptions(nodes=nodes))
    assert placed == {"tri://a": {"pre": 1}, "tri://b": {"pre": 1, "cls": 1}}
    assert shares_by_model(placed) == {
        "cls": {"tri://a": 0, "tri://b": 1},
        "pre": {"tri://a": 1, "tri://b": 1},
    }


def test_hop_extras_are_the_farthest_members_round_trip_over_the_profiled_one() -> None:
    trips = {"a": 0.001, "b": 0.004, "local": None}
    assert hop_extras(trips, {"pre": "a"}) == {"pre": pytest.approx(0.003)}
    assert hop_extras(trips, {"pre": "b"}) == {"pre": 0.0}  # profiled on the farthest
    assert hop_extras(trips, {"pre": "a"}, {"pre": ["a"]}) == {"pre": 0.0}  # only on a
    assert hop_extras(trips, {"pre": "local"}) == {"pre": 0.0}  # nothing to compare to
    with pytest.raises(ValidationError, match=r"profiled_on\.pre"):
        hop_extras(trips, {"pre": "nowhere"})


def test_add_hops_shifts_every_batch_and_the_planner_sees_it() -> None:
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.010, 2: 0.012, 4: 0.016}}})
    far = add_hops(prof, {"m": 0.005})
    assert [far.latency("m", "cpu", b) for b in (1, 2, 4)] == pytest.approx([0.015, 0.017, 0.021])
    assert add_hops(prof, {}).latency("m", "cpu", 1) == 0.010
    with pytest.raises(ValidationError, match=r"extras\.m"):
        add_hops(prof, {"m": -0.001})
    # a hop that eats the SLO's headroom makes the planner pay for more (or it is infeasible)
    pipe = Pipeline.linear("p", ["m"])
    trace = gamma_trace(150.0, 1.0, 20.0, np.random.default_rng(0))
    near = plan_inferline(pipe, prof, trace, 0.040)
    farther = plan_inferline(pipe, add_hops(prof, {"m": 0.012}), trace, 0.040)
    assert farther.estimated_latency_s > near.estimated_latency_s
    assert farther.cost_per_hour >= near.cost_per_hour

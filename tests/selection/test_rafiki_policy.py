"""The ``rafiki`` selection policy: validation naming the field, JSON round trip, and a live
state built from the queries in flight (fewer models once a backlog is in flight)."""

from __future__ import annotations

import json

import pytest

from inferline.core import ValidationError
from inferline.selection import make_policy
from inferline.selection.plugin import inferline_selection_policies

LAT = {
    "a": {"1": 20.0, "4": 30.0, "8": 45.0},
    "b": {"1": 30.0, "4": 50.0, "8": 80.0},
    "c": {"1": 40.0, "4": 80.0, "8": 140.0},
}
ACC = {"a": 0.80, "b": 0.82, "c": 0.84, "a+b": 0.83, "a+c": 0.86, "b+c": 0.87, "a+b+c": 0.92}
REG = inferline_selection_policies()


def _cfg(**kw):
    return {
        "policy": "rafiki",
        "models": ["a", "b", "c"],
        "latency_ms": LAT,
        "subset_accuracy": ACC,
        "tau_ms": 300.0,
        "train_updates": 40,
        **kw,
    }


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tau_ms": None}, "tau_ms"),
        ({"tau_ms": -1}, "tau_ms"),
        ({"latency_ms": {**LAT, "a": {"1": -2.0}}}, "latency_ms.a.1"),
        ({"latency_ms": {**LAT, "z": {"1": 2.0}}}, "latency_ms"),
        ({"subset_accuracy": {k: v for k, v in ACC.items() if k != "a+c"}}, "subset_accuracy"),
        ({"subset_accuracy": {**ACC, "a": 1.5}}, "subset_accuracy.a"),
        ({"train_updates": 0}, "train_updates"),
        ({"rate_ref": 0}, "rate_ref"),
        ({"train": {"lr": -1}}, "train.lr"),
        ({"train": {"bogus": 1}}, "train"),
    ],
)
def test_bad_parameters_name_the_field(change, field) -> None:
    with pytest.raises(ValidationError) as e:
        make_policy(_cfg(**change), factories=REG)
    assert e.value.field == field


def test_config_round_trips_json_and_training_is_cached() -> None:
    p = make_policy(_cfg(), factories=REG)
    again = make_policy(json.loads(json.dumps(p.config())), factories=REG)
    assert again.config() == p.config()
    assert again.agent is p.agent  # the same configuration trains once


def test_live_state_tracks_the_queries_in_flight() -> None:
    """The simulator's state from live queries: waits, queue length, rate, work left, mask.
    (Whether the trained agent then uses fewer models is integration/test_rafiki_live.py's
    check: it needs a few hundred training updates.)"""
    clock = Clock()
    p = make_policy(_cfg(clock=clock), factories=REG)
    st = p.init()
    x0 = object()
    p.select(st, x0)
    p.combine(st, x0, {})
    quiet, _ = p.live_state(0.0)
    xs = [object() for _ in range(60)]
    for i, x in enumerate(xs):  # a backlog: 60 queries within 0.3 s
        clock.t = 1.0 + i * 0.005
        p.select(st, x)
    busy, mask = p.live_state(clock.t)
    qf = p.cfg.queue_features
    assert quiet[: qf + 2].sum() == pytest.approx(quiet[qf + 1])  # no wait, no queue
    assert busy[0] == pytest.approx(0.295 / 0.3, rel=1e-3)  # the oldest wait, in taus
    assert busy[qf] > quiet[qf] and busy[qf + 1] > quiet[qf + 1]  # queue length and rate
    assert busy[-3:].min() == 0.0 and busy[-3:].max() > 0.0  # work left from the least loaded
    assert mask.any() and not mask.all()
    s = p.status()
    assert s["in_flight"] == 60 and s["decisions"] == 61
    assert 1.0 <= s["models_per_query"] <= 3.0
    for x in xs:
        p.combine(st, x, {"a": 1})
    assert p.status()["in_flight"] == 0 and set(p.status()["outstanding"].values()) == {0}


def test_deployment_errors_name_the_params_field() -> None:
    from inferline.adapters import PluginHost
    from inferline.server import SelectionAppSpec, build_policy

    block = {"policy": "rafiki", "models": ["a", "b", "c"], "params": _cfg(tau_ms=-5)}
    del block["params"]["policy"], block["params"]["models"]
    spec = SelectionAppSpec.from_dict(json.loads(json.dumps(block)))
    assert SelectionAppSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValidationError) as e:
        build_policy("vote", spec, PluginHost.default())
    assert e.value.field == "apps.vote.selection.params.tau_ms"

"""Selection policies register through the plugin host, built-ins included, and every registered
policy passes the conformance checks."""

import functools
import random

import pytest

from inferline.adapters import PluginHost, hookimpl
from inferline.core import ValidationError
from inferline.selection import BUILTIN_POLICIES, Combined, Exp4, check_policy, make_policy


def test_builtins_come_from_the_entry_point():
    host = PluginHost.default()
    assert "selection" in host.plugin_names()
    assert set(BUILTIN_POLICIES) <= set(host.selection_policies())
    p = host.selection_policy("exp4", ["a", "b"], rng=random.Random(0), eta=0.5)
    assert isinstance(p, Exp4) and p.eta == 0.5


@pytest.mark.parametrize("name", sorted(PluginHost.default().selection_policies()))
def test_every_registered_policy_conforms(name):
    factory = PluginHost.default().selection_policies()[name]
    if name == "rafiki":  # needs the models' profiles (a small pretraining; a fixed clock)
        lat = {m: {"1": 20.0, "4": 40.0} for m in ("a", "b", "c")}
        acc = {"a": 0.8, "b": 0.8, "c": 0.8, "a+b": 0.8, "a+c": 0.8, "b+c": 0.8, "a+b+c": 0.9}
        factory = functools.partial(
            factory,
            latency_ms=lat,
            subset_accuracy=acc,
            tau_ms=300.0,
            train_updates=5,
            clock=lambda: 0.0,
        )
    check_policy(name, factory)


class Mutating:
    """A deliberately broken policy (fake): it changes the predictions it is given."""

    def __init__(self, models, rng=None):
        self.models = tuple(models)

    def init(self):
        return Exp4(self.models).init()

    def select(self, state, x):
        return list(self.models)

    def combine(self, state, x, predictions):
        return Combined(next(iter(predictions.values()), None), 1.0, len(predictions), 3)

    def observe(self, state, x, feedback, predictions):
        predictions.clear()
        return state

    def state_from_dict(self, d):
        return Exp4(self.models).state_from_dict(d)


def test_checks_catch_a_broken_policy():
    with pytest.raises(AssertionError, match="'mutating'"):
        check_policy("mutating", Mutating)


def test_a_plugin_policy_is_built_from_a_config_through_the_host_registry():
    class Plugin:
        @hookimpl
        def inferline_selection_policies(self):
            return {"mutating": Mutating}

    host = PluginHost.default()
    host.register(Plugin(), "third-party")
    reg = host.selection_policies()
    assert isinstance(make_policy({"policy": "mutating", "models": ["a"]}, factories=reg), Mutating)
    assert make_policy({"policy": "exp3", "models": ["a", "b"]}, factories=reg).name == "exp3"
    with pytest.raises(ValidationError, match="policy"):
        make_policy({"policy": "mutating", "models": ["a"]})  # not a built-in

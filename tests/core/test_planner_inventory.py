"""The planner's inventory (``PlannerOptions.inventory``): a plan never needs more units of a
hardware kind than the deployment has, and is still the cheapest such plan the search finds."""

from __future__ import annotations

import numpy as np
import pytest
from test_planner import _cost, _exhaustive, _p99, _profiles

from inferline.core import (
    DEFAULT_CATALOG,
    InfeasibleError,
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    make_plan,
    plan_inferline,
)
from inferline.core.planning import inventory_use, over_inventory


def _fan(seed: int):
    rng = np.random.default_rng(seed)
    pipe = Pipeline("fan", ("a", "b", "c"), (("a", "b"), ("a", "c")), {"c": 0.5})
    prof = _profiles(seed, pipe.models)
    trace = gamma_trace(30.0, float(rng.choice([1.0, 4.0])), 15.0, rng)
    fastest = pipe.critical_path({m: prof.latency(m, "gpu-v100", 1) for m in pipe.models})[0]
    slo = round(fastest * float(rng.uniform(1.5, 4.0)), 4)
    return pipe, prof, trace, slo


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_plan_fits_the_inventory_and_is_the_cheapest_that_does(seed):
    pipe, prof, trace, slo = _fan(seed)
    options = PlannerOptions(inventory={"cpu": 2}, rate_margin=0.0)  # the paper's test
    plan = plan_inferline(pipe, prof, trace, slo, options=options)
    assert inventory_use(plan.models, DEFAULT_CATALOG).get("cpu", 0) <= 2
    assert over_inventory(plan.models, DEFAULT_CATALOG, options) is None
    assert _p99(pipe, plan.models, prof, trace) <= slo
    opt = _exhaustive(pipe, prof, trace, slo, 4, options)
    assert opt is not None
    assert plan.cost_per_hour <= 1.2 * _cost(opt) + 1e-9
    unlimited = plan_inferline(pipe, prof, trace, slo, options=PlannerOptions(rate_margin=0.0))
    assert unlimited.cost_per_hour <= plan.cost_per_hour + 1e-9
    if seed in (4, 5):  # the unlimited plan puts more than 2 replicas on CPUs
        assert inventory_use(unlimited.models, DEFAULT_CATALOG)["cpu"] > 2


def test_an_inventory_that_holds_the_unlimited_plan_changes_nothing():
    pipe, prof, trace, slo = _fan(5)
    free = plan_inferline(pipe, prof, trace, slo)
    exact = PlannerOptions(inventory=inventory_use(free.models, DEFAULT_CATALOG))
    assert plan_inferline(pipe, prof, trace, slo, options=exact).models == free.models


def test_a_full_hardware_sends_the_bottleneck_to_batching_then_to_slower_hardware():
    """One V100 for a model that needs more throughput than one V100 replica at batch 1 gives:
    initialization batches on it rather than asking for a second V100."""
    pipe = Pipeline.linear("one", ["m"])
    prof = Profiles.from_latencies(
        {"m": {"gpu-v100": {1: 0.01, 2: 0.011, 4: 0.012}, "cpu": {1: 0.03}}}
    )
    trace = gamma_trace(250.0, 1.0, 10.0, np.random.default_rng(0))
    options = PlannerOptions(inventory={"gpu-v100": 1})
    planner = Planner(pipe, prof, trace, 0.1, options=options)
    init = planner.initialize()
    assert init["m"].hardware == "gpu-v100" and init["m"].replicas == 1
    assert init["m"].max_batch_size > 1
    # at 600 q/s even batch 4 on one V100 (333 q/s) is not enough: the rest goes to CPUs...
    fast = gamma_trace(600.0, 1.0, 10.0, np.random.default_rng(0))
    plan = plan_inferline(pipe, prof, fast, 0.1, options=options)
    assert plan.models["m"].hardware == "cpu"  # one model runs on one kind of hardware
    # ...unless CPUs are limited too, and then the answer names the inventory
    tight = PlannerOptions(inventory={"gpu-v100": 1, "cpu": 4})
    with pytest.raises(InfeasibleError, match=r"within the inventory \(cpu: 4, gpu-v100: 1\)"):
        plan_inferline(pipe, prof, fast, 0.1, options=tight)


def test_initialization_places_models_on_the_fastest_hardware_with_room():
    pipe, prof, trace, slo = _fan(5)
    planner = Planner(pipe, prof, trace, slo, options=PlannerOptions(inventory={"gpu-v100": 1}))
    init = planner._initial_placement(0.0)
    assert [c.hardware for c in init.values()].count("gpu-v100") == 1
    assert init["a"].hardware == "gpu-v100"  # pipeline order


def test_hardware_with_room_too_slow_for_the_slo_is_named_at_once():
    pipe, prof, trace, slo = _fan(6)
    options = PlannerOptions(inventory={"gpu-v100": 0, "gpu-k80": 0})
    with pytest.raises(InfeasibleError, match="even without queueing"):
        plan_inferline(pipe, prof, trace, slo, options=options)
    planner = Planner(pipe, prof, trace, slo, options=options)
    with pytest.raises(InfeasibleError, match="even without queueing"):
        planner.initialize()  # the search within the inventory: it gives up before simulating
    assert planner.stats().simulations == 0


def test_replica_units_count_a_cpu_replica_s_threads():
    pipe = Pipeline.linear("one", ["m"])
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.02}}})
    trace = gamma_trace(120.0, 1.0, 10.0, np.random.default_rng(2))
    free = plan_inferline(pipe, prof, trace, 0.1)
    n = free.models["m"].replicas
    ok = PlannerOptions(inventory={"cpu": 2 * n}, replica_units={"m": 2})
    assert plan_inferline(pipe, prof, trace, 0.1, options=ok).models == free.models
    short = PlannerOptions(inventory={"cpu": 2 * n - 1}, replica_units={"m": 2})
    with pytest.raises(InfeasibleError, match="inventory"):
        plan_inferline(pipe, prof, trace, 0.1, options=short)
    gpu = {"m": ModelConfig("gpu-k80", 1, 3)}
    assert inventory_use(gpu, DEFAULT_CATALOG, {"m": 2}) == {"gpu-k80": 3}


@pytest.mark.parametrize("strategy", ["cg-mean", "cg-peak"])
def test_the_coarse_grained_baselines_refuse_a_plan_that_does_not_fit(strategy):
    pipe, prof, trace, slo = _fan(5)
    plan = make_plan(strategy, pipe, prof, trace, slo)
    use = inventory_use(plan.models, DEFAULT_CATALOG)
    fits = PlannerOptions(inventory=use)
    assert make_plan(strategy, pipe, prof, trace, slo, options=fits).models == plan.models
    hw, n = next(iter(use.items()))
    with pytest.raises(InfeasibleError, match=f"{hw}: {n} > {n - 1}"):
        make_plan(strategy, pipe, prof, trace, slo, options=PlannerOptions(inventory={hw: n - 1}))


def test_options_round_trip_and_refuse_bad_inventories():
    o = PlannerOptions(inventory={"cpu": 8, "gpu-v100": 0}, replica_units={"a": 4})
    assert PlannerOptions.from_dict(o.to_dict()) == o
    with pytest.raises(ValidationError, match=r"inventory\.cpu"):
        PlannerOptions(inventory={"cpu": -1})
    with pytest.raises(ValidationError, match=r"replica_units\.a"):
        PlannerOptions.from_dict({"replica_units": {"a": 0}})
    with pytest.raises(ValidationError, match="inventory"):
        PlannerOptions.from_dict({"inventory": [1]})
    pipe, prof, trace, slo = _fan(4)
    with pytest.raises(ValidationError, match="inventory"):
        Planner(pipe, prof, trace, slo, options=PlannerOptions(inventory={"tpu": 1}))


# Means measured on an H100 machine (benchmarks/gpu_placement.py, contention profile): the
# preprocessing step ran 0.3 ms faster in the GPU replica's process than on a busy core.
_H100 = Profiles.from_latencies(
    {
        "pre": {
            "cpu": {1: 0.00103, 2: 0.00122, 4: 0.00176, 8: 0.00210, 16: 0.00371, 32: 0.00456},
            "gpu-v100": {1: 0.00075, 2: 0.00080, 4: 0.00195, 8: 0.00195, 16: 0.00195},
        },
        "cnn": {
            "cpu": {1: 0.02163, 2: 0.02344, 4: 0.04292, 8: 0.11189, 16: 0.18822},
            "gpu-v100": {1: 0.00130, 2: 0.00152, 4: 0.00153, 8: 0.00155, 16: 0.00212},
        },
    }
)


def test_a_scarce_gpu_goes_to_the_model_that_loses_most_without_it():
    # More than five cores of CNN can carry: only the GPU serves it, and the preprocessing
    # step, a little faster on the GPU too, must not take the only one.
    pipe = Pipeline.linear("cnn", ["pre", "cnn"])
    trace = gamma_trace(450.0, 1.0, 20.0, np.random.default_rng(3))
    options = PlannerOptions(inventory={"cpu": 6, "gpu-v100": 1}, gpu_host_units={"cnn": 1})
    plan = plan_inferline(pipe, _H100, trace, 0.1, options=options)
    assert plan.models["cnn"].hardware == "gpu-v100"
    assert plan.models["pre"].hardware == "cpu"
    assert over_inventory(plan.models, DEFAULT_CATALOG, options) is None
    assert _p99(pipe, plan.models, _H100, trace) <= 0.1


def test_a_gpu_replica_s_host_cores_count_against_the_cpu_inventory():
    configs = {"pre": ModelConfig("cpu", 1, 2), "cnn": ModelConfig("gpu-v100", 1, 3)}
    assert inventory_use(configs, DEFAULT_CATALOG) == {"cpu": 2, "gpu-v100": 3}
    assert inventory_use(configs, DEFAULT_CATALOG, {"pre": 2}, {"cnn": 2}) == {
        "cpu": 10,
        "gpu-v100": 3,
    }
    # A slow CPU model next to a GPU model whose replicas hold a core each: with 4 cores,
    # the GPU replicas' host cores leave the CPU model fewer replicas than without them.
    pipe = Pipeline.linear("two", ["pre", "cnn"])
    prof = Profiles.from_latencies(
        {"pre": {"cpu": {1: 0.02, 2: 0.03}}, "cnn": {"gpu-v100": {1: 0.02, 2: 0.021}}}
    )
    trace = gamma_trace(150.0, 1.0, 15.0, np.random.default_rng(4))
    free = plan_inferline(pipe, prof, trace, 0.2)
    need = inventory_use(free.models, DEFAULT_CATALOG, {}, {"cnn": 1})
    options = PlannerOptions(inventory={"cpu": need["cpu"] - 1}, gpu_host_units={"cnn": 1})
    try:
        plan = plan_inferline(pipe, prof, trace, 0.2, options=options)
    except InfeasibleError as e:
        assert "inventory" in str(e)
    else:
        assert over_inventory(plan.models, DEFAULT_CATALOG, options) is None
        assert plan.models != free.models
    o = PlannerOptions(inventory={"cpu": 4}, gpu_host_units={"cnn": 2})
    assert PlannerOptions.from_dict(o.to_dict()) == o
    with pytest.raises(ValidationError, match=r"gpu_host_units\.cnn"):
        PlannerOptions(gpu_host_units={"cnn": -1})

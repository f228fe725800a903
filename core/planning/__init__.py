"""Planning: a configuration (hardware, batch size, replicas per model) for a pipeline, a
sample trace and a latency SLO, at the lowest cost.

Where things are:

* ``_search.py``: InferLine's search, Algorithms 1 and 2 (:class:`PlannerCore`), over
  ``_space.py`` (:class:`SearchSpace`: configurations, their cost, the cached feasibility
  judgement, the inventory's room);
* ``_bound.py``: the sound lower bound on SLO misses that skips hopeless simulations
  (:class:`MissBound`);
* ``_inferline.py``: the planner InferLine runs, the search plus its extensions (escape, widen)
  (:class:`Planner`, :func:`plan_inferline`);
* ``_baselines.py``: the coarse-grained baselines CG-Mean and CG-Peak; ``_strategies.py``:
  planning with a named strategy (:func:`make_plan`);
* ``_ladder.py``: the tuner's ladder, re-plans of the planned hardware for higher rates;
* ``_margin.py``: the automatic rate margin (``rate_margin="auto"``, the default), from the
  spread of the sample's windowed rates;
* ``_variants.py``: planning with model variants under an accuracy floor;
* ``_server.py``: planning the serving system's own batchers (``PlannerOptions.server``:
  Triton's dynamic batcher, TF Serving's batch scheduler);
* ``_options.py``: :class:`PlannerOptions`, progress and statistics; ``_placement.py``: the
  hardware a model may use and the inventory its replicas take; ``_tuner_inputs.py``: the
  tuner's inputs every plan carries; ``_servers.py``: planning across a fleet's servers
  (each a node; the hop to each server added to the profiles).
"""

from ._baselines import coarse_grained_configs, plan_cg_mean, plan_cg_peak
from ._bound import MissBound
from ._inferline import Planner, plan_inferline
from ._ladder import (
    LADDER_FACTORS,
    capacity_factor,
    largest_feasible,
    pin_hardware,
    plan_ladder,
    with_ladder,
)
from ._margin import auto_rate_margin, resolve_margin
from ._nodes import (
    NODES_FORMAT,
    NodeInventory,
    bin_replicas,
    nodes_document,
    nodes_from_dicts,
    nodes_from_document,
)
from ._options import (
    AUTO_MARGIN,
    SERVER_KINDS,
    PlannerOptions,
    PlannerStats,
    PlanProgress,
    ProgressFn,
)
from ._placement import (
    fastest_hardware,
    inventory_use,
    over_inventory,
    place_on_nodes,
    replica_use,
    total_inventory,
    usable_hardware,
)
from ._search import PlannerCore
from ._server import ServerConfig, ServerSearch, plan_estimator_options, plan_server_batchers
from ._servers import add_hops, hop_extras, server_nodes, shares_by_model
from ._space import SearchSpace
from ._strategies import STRATEGIES, make_plan
from ._tuner_inputs import tuner_inputs
from ._variants import VariantPlan, plan_with_variants, plan_with_variants_section

__all__ = [
    "AUTO_MARGIN",
    "LADDER_FACTORS",
    "NODES_FORMAT",
    "SERVER_KINDS",
    "STRATEGIES",
    "MissBound",
    "NodeInventory",
    "PlanProgress",
    "Planner",
    "PlannerCore",
    "PlannerOptions",
    "PlannerStats",
    "ProgressFn",
    "SearchSpace",
    "ServerConfig",
    "ServerSearch",
    "VariantPlan",
    "add_hops",
    "auto_rate_margin",
    "bin_replicas",
    "capacity_factor",
    "coarse_grained_configs",
    "fastest_hardware",
    "hop_extras",
    "inventory_use",
    "largest_feasible",
    "make_plan",
    "nodes_document",
    "nodes_from_dicts",
    "nodes_from_document",
    "over_inventory",
    "pin_hardware",
    "place_on_nodes",
    "plan_cg_mean",
    "plan_cg_peak",
    "plan_estimator_options",
    "plan_inferline",
    "plan_ladder",
    "plan_server_batchers",
    "plan_with_variants",
    "plan_with_variants_section",
    "replica_use",
    "resolve_margin",
    "server_nodes",
    "shares_by_model",
    "total_inventory",
    "tuner_inputs",
    "usable_hardware",
    "with_ladder",
]

"""Planning a fleet (a backend made of several servers, ``inferline.adapters.fleet``) across
its servers: each server's own inventory as a planner node, the hop to each server added to
the profiles, and the plan's placement handed to the fleet before it deploys or scales
(docs/fleets.md, "Planning across servers"). Backends that are not fleets pass through."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inferline.core import (
    DEFAULT_CATALOG,
    CapacityError,
    InferlineError,
    ModelConfig,
    PlannerOptions,
    Profiles,
)

__all__ = ["fleet_planner_options", "fleet_profiles", "place_on_fleet"]

log = logging.getLogger(__name__)


def _is_fleet(backend: Any) -> bool:
    return callable(getattr(backend, "server_nodes", None)) and callable(
        getattr(backend, "place", None)
    )


def fleet_planner_options(
    backend: Any, options: PlannerOptions, catalog: Any, units: Mapping[str, int]
) -> PlannerOptions | None:
    """``options`` with one node per fleet member (its own inventory, named by its URL), so
    the plan bins replicas into the servers as it bins them into Ray nodes; None when
    ``backend`` is not a fleet. A member's replica takes its ``threads`` of ``cpu`` or one
    accelerator (no host cores: a server's GPU instance does not hold one of its cores)."""
    if not _is_fleet(backend):
        return None
    return replace(options, nodes=backend.server_nodes(catalog), replica_units=dict(units))


def fleet_profiles(backend: Any, profiles: Profiles) -> Profiles:
    """``profiles`` with each model's hop added: what the round trip to its farthest member
    adds over the member its profile was measured through (``FleetBackend.profiles_with_hops``:
    the attached profile is taken on the model's first replica). Unchanged when the
    backend is not a fleet or measured no round trips."""
    if not _is_fleet(backend):
        return profiles
    profiled_on: dict[str, str] = {}
    for m in profiles.models:
        try:
            hs = backend.replicas(m)
        except InferlineError:  # a profiled model the fleet does not hold
            continue
        if hs:
            profiled_on[m] = hs[0].server
    return backend.profiles_with_hops(profiles, profiled_on)  # type: ignore[no-any-return]


def place_on_fleet(
    backend: Any,
    configs: Mapping[str, ModelConfig],
    host: Any,
    units: Mapping[str, int] | None = None,
) -> None:
    """Give a fleet the plan's replicas per server (first-fit decreasing over its members,
    as the planner judged it) before it deploys or scales; ``host``: the plugin host whose
    hardware catalog the plan was made with (None: the default catalog); ``units``: a CPU replica's
    cores per model (default: the fleet's, of the models it holds). A plan that was not
    made for these servers and does not fit them one by one is spread evenly (logged)."""
    if not _is_fleet(backend):
        return
    catalog = DEFAULT_CATALOG if host is None else host.hardware_catalog()
    try:
        backend.place(configs, catalog, {**backend.replica_units(), **(units or {})})
    except CapacityError as e:
        log.warning("fleet: the plan does not fit the servers one by one (%s): spread evenly", e)

"""Planning across servers (a fleet: several Triton/TF Serving servers as one backend).

A fleet member is planned as a node (``_nodes.py``): its inventory is a
:class:`NodeInventory` named by the member's URL, the planner bins replicas into the members
first-fit decreasing exactly as it bins them into Ray nodes, and the fleet deploys each
model's replicas where :func:`~._placement.place_on_nodes` put them
(:func:`shares_by_model`: the same deterministic binning, so the plan printed and the
placement served agree).

A remote server's round trip is part of its replicas' service time. Profiles of an attached
model are measured through one member (the first that serves it), so they already hold that
member's round trip; a replica on a member farther away is slower by the difference.
:func:`hop_extras` is that difference for the slowest member, and :func:`add_hops` adds it
to every batch size of the model's profile. The estimator judges all replicas of a model
alike, so the planner sees every replica as slow as the one on the farthest member
(conservative: a batch may go to any replica).

Pure data and arithmetic, like the rest of ``core``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from .._profiles import BatchProfile, Profiles
from ..errors import ValidationError
from ._nodes import NodeInventory

__all__ = ["add_hops", "hop_extras", "server_nodes", "shares_by_model"]


def server_nodes(
    inventories: Sequence[tuple[str, Mapping[str, int]]], kinds: Sequence[str] | None = None
) -> tuple[NodeInventory, ...]:
    """One :class:`NodeInventory` per ``(server URL, inventory)``, in the order given (the
    order first-fit tries them); with ``kinds`` (the catalog's names) other kinds are
    dropped (a member may report hardware the planner cannot price)."""
    out = []
    for url, inv in inventories:
        units = {k: int(v) for k, v in inv.items() if kinds is None or k in kinds}
        out.append(NodeInventory(url, units))
    return tuple(out)


def shares_by_model(placement: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``{server: {model: n}}`` (``place_on_nodes``) turned into ``{model: {server: n}}``,
    every server listed for every model (0 where it holds none)."""
    models = sorted({m for per in placement.values() for m in per})
    return {m: {s: int(per.get(m, 0)) for s, per in placement.items()} for m in models}


def hop_extras(
    round_trips: Mapping[str, float | None],
    profiled_on: Mapping[str, str],
    serving: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, float]:
    """Per model, the round trip its slowest member adds over the member it was profiled
    on (``profiled_on[model]``), in seconds, never below 0.

    ``round_trips``: each member's measured round trip (None: not measured, e.g. an
    in-process member, whose hop the profile already holds or that has none);
    ``serving[model]``: the members that may hold its replicas (default: all measured)."""
    out: dict[str, float] = {}
    for model, at in profiled_on.items():
        base = round_trips.get(at)
        if base is None:
            if at not in round_trips:
                raise ValidationError(f"profiled_on.{model}", f"one of {sorted(round_trips)}", at)
            out[model] = 0.0  # the profiled member's hop is unknown: nothing to compare to
            continue
        members = (serving or {}).get(model, list(round_trips))
        trips = [t for s in members if (t := round_trips.get(s)) is not None]
        out[model] = max(0.0, max(trips, default=base) - base)
    return out


def _shifted(p: BatchProfile, extra: float) -> BatchProfile:
    return replace(
        p,
        latency_s=p.latency_s + extra,
        p50_s=None if p.p50_s is None else p.p50_s + extra,
        p99_s=None if p.p99_s is None else p.p99_s + extra,
    )


def add_hops(profiles: Profiles, extras: Mapping[str, float]) -> Profiles:
    """``profiles`` with ``extras[model]`` seconds added to every batch of the model on
    every hardware (a round trip is paid once per batch, whatever its size)."""
    for m, e in extras.items():
        if not isinstance(e, int | float) or isinstance(e, bool) or e < 0:
            raise ValidationError(f"extras.{m}", "seconds >= 0", e)
    models = {
        m: {
            hw: {b: _shifted(p, float(extras.get(m, 0.0))) for b, p in by_b.items()}
            for hw, by_b in by_hw.items()
        }
        for m, by_hw in profiles.models.items()
    }
    return Profiles(models, profiles.wake_up)

"""Fleets: one logical model whose replicas live on several servers (``local://``, Triton,
TF Serving, mixed). ``FleetBackend`` composes member backends built the ordinary way;
``inferline.deploy.open_backend`` builds one from a list of URLs (a deployment's ``"backend"``
as a JSON list). See docs/fleets.md."""

from ._adopt import adopted_config, check_contracts, member_spec, merge_found
from ._backend import FleetBackend, fleet_of
from ._replica import FleetReplica
from ._spread import spread

__all__ = [
    "FleetBackend",
    "FleetReplica",
    "adopted_config",
    "check_contracts",
    "fleet_of",
    "member_spec",
    "merge_found",
    "spread",
]

"""Fleets: one logical model whose replicas live on several servers (``local://``, Triton,
TF Serving, mixed). ``FleetBackend`` composes member backends built the ordinary way;
``inferline.deploy.open_backend`` builds one from a list of URLs (a deployment's ``"backend"``
as a JSON list). See docs/fleets.md."""

from ._adopt import adopted_config, check_contracts, member_spec, merge_found
from ._backend import FleetBackend, fleet_of
from ._dns import (
    DnsSource,
    MembershipChange,
    MembershipPolicy,
    parse_dns_source,
    resolve_dns,
    resolve_dns_now,
)
from ._inventory import Hop, hop_of, inventory_source, measure_hop, served_instances
from ._replica import FleetReplica
from ._servers import MemberNode
from ._spread import cover, spread

__all__ = [
    "DnsSource",
    "FleetBackend",
    "FleetReplica",
    "Hop",
    "MemberNode",
    "MembershipChange",
    "MembershipPolicy",
    "adopted_config",
    "check_contracts",
    "cover",
    "fleet_of",
    "hop_of",
    "inventory_source",
    "measure_hop",
    "member_spec",
    "merge_found",
    "parse_dns_source",
    "resolve_dns",
    "resolve_dns_now",
    "served_instances",
    "spread",
]

"""Backend adapters and the plugin host (pluggy, entry-point group ``inferline``).

The backend conformance checks are the submodule ``inferline.adapters.checks`` (imported on
demand, not from here): ``run_conformance`` runs them on any backend, built-in or third-party.
"""

from ._host import DISABLED_ENV, ENTRYPOINT_GROUP, PluginHost
from ._ports import address_in_use, free_port
from .hookspecs import HOOK_NAMES, BackendFactory, PolicyFactory, hookimpl, hookspec

__all__ = [
    "DISABLED_ENV",
    "ENTRYPOINT_GROUP",
    "HOOK_NAMES",
    "BackendFactory",
    "PluginHost",
    "PolicyFactory",
    "address_in_use",
    "free_port",
    "hookimpl",
    "hookspec",
]

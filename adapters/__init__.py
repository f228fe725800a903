"""Backend adapters and the plugin host (pluggy, entry-point group ``inferline``)."""

from ._host import DISABLED_ENV, ENTRYPOINT_GROUP, PluginHost
from .hookspecs import BackendFactory, hookimpl, hookspec

__all__ = [
    "DISABLED_ENV",
    "ENTRYPOINT_GROUP",
    "BackendFactory",
    "PluginHost",
    "hookimpl",
    "hookspec",
]

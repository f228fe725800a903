"""``PluginHost``: the one place that calls pluggy's hooks (``pm.hook``).

Loading is explicit (``load_entrypoints()``) and repeatable: a second call registers only
plugins that were not registered yet. ``INFERLINE_DISABLED_PLUGINS`` (comma-separated entry
point or plugin names) blocks plugins, whether they come from entry points or ``register()``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import pluggy

from inferline.core import (
    DEFAULT_CATALOG,
    Backend,
    Hardware,
    HardwareCatalog,
    NotFoundError,
    ValidationError,
)

from . import hookspecs
from .hookspecs import BackendFactory

__all__ = ["DISABLED_ENV", "ENTRYPOINT_GROUP", "PluginHost"]

log = logging.getLogger(__name__)

ENTRYPOINT_GROUP = "inferline"
DISABLED_ENV = "INFERLINE_DISABLED_PLUGINS"


def _disabled_from_env() -> set[str]:
    raw = os.environ.get(DISABLED_ENV, "")
    return {n.strip() for n in raw.split(",") if n.strip()}


class PluginHost:
    """Registers plugins and answers questions through their hooks.

    ``PluginHost()`` starts empty; ``PluginHost.default()`` also loads the entry points.
    """

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)

    @classmethod
    def default(cls) -> PluginHost:
        host = cls()
        host.load_entrypoints()
        return host

    # -- registration -----------------------------------------------------------------------

    def _apply_disabled(self) -> set[str]:
        disabled = _disabled_from_env()
        for name in disabled:
            if not self._pm.is_blocked(name):
                plugin = self._pm.get_plugin(name)
                if plugin is not None:
                    self._pm.unregister(plugin)
                self._pm.set_blocked(name)
        return disabled

    def load_entrypoints(self) -> list[str]:
        """Register every ``inferline`` entry point not registered or disabled yet; returns
        the names registered by this call."""
        self._apply_disabled()
        before = set(self.plugin_names())
        self._pm.load_setuptools_entrypoints(ENTRYPOINT_GROUP)
        added = sorted(set(self.plugin_names()) - before)
        if added:
            log.debug("loaded inferline plugins %s", added)
        return added

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions) under ``name``;
        returns the name, or None when the name is disabled."""
        self._apply_disabled()
        if name is not None and self._pm.is_blocked(name):
            log.info("plugin %r is disabled by %s", name, DISABLED_ENV)
            return None
        if name is not None and self._pm.get_plugin(name) is plugin:
            return name
        return self._pm.register(plugin, name)

    def unregister(self, name: str) -> None:
        plugin = self._pm.get_plugin(name)
        if plugin is None:
            raise NotFoundError("plugin", name, self.plugin_names())
        self._pm.unregister(plugin)

    def plugin_names(self) -> list[str]:
        return sorted(n for n, p in self._pm.list_name_plugin() if p is not None and n is not None)

    # -- hooks ------------------------------------------------------------------------------

    def _backend_factories(self) -> dict[str, tuple[str, BackendFactory]]:
        out: dict[str, tuple[str, BackendFactory]] = {}
        for impl in self._pm.hook.inferline_backend_schemes.get_hookimpls():
            result = impl.function()
            if not result:
                continue
            for scheme, factory in dict(result).items():
                scheme = scheme.lower()
                if scheme in out and out[scheme][1] is not factory:
                    raise ValidationError(
                        f"backend scheme {scheme!r}",
                        f"one provider (plugins {out[scheme][0]!r} and {impl.plugin_name!r} "
                        f"both offer it; disable one with {DISABLED_ENV})",
                        impl.plugin_name,
                    )
                out[scheme] = (impl.plugin_name, factory)
        return out

    def schemes(self) -> list[str]:
        """URL schemes of the registered backends."""
        return sorted(self._backend_factories())

    def backend_for(self, url: str, **options: Any) -> Backend:
        """A new backend for ``url`` (``local://``, ``triton://host:8001``, ...)."""
        if not isinstance(url, str) or "://" not in url:
            raise ValidationError("backend url", "'scheme://...' such as 'local://'", url)
        scheme = urlsplit(url).scheme.lower()
        factories = self._backend_factories()
        if scheme not in factories:
            raise NotFoundError("backend scheme", scheme, sorted(factories))
        return factories[scheme][1](url, dict(options))

    def hardware_catalog(self, base: HardwareCatalog = DEFAULT_CATALOG) -> HardwareCatalog:
        """``base`` with every plugin's hardware kinds merged in."""
        extra: dict[str, Hardware] = {}
        owner: dict[str, str] = {}
        for impl in self._pm.hook.inferline_hardware_kinds.get_hookimpls():
            result: Mapping[str, Hardware] | None = impl.function()
            for name, hw in dict(result or {}).items():
                if name in extra and extra[name] != hw:
                    raise ValidationError(
                        f"hardware kind {name!r}",
                        "one definition",
                        f"{owner[name]!r} and {impl.plugin_name!r} differ",
                    )
                extra[name], owner[name] = hw, impl.plugin_name
        return base.merged(HardwareCatalog(extra))

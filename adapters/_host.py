"""``PluginHost``: the one place that calls pluggy's hooks (``pm.hook``).

Loading is explicit (``load_entrypoints()``) and repeatable: a second call registers only
plugins that were not registered yet. ``INFERLINE_DISABLED_PLUGINS`` (comma-separated entry
point or plugin names) blocks plugins, whether they come from entry points or ``register()``.
A plugin whose module fails to import is logged and recorded (``failed()``), not fatal: one
broken third-party package must not take the built-in backends down with it. A plugin that
implements an ``inferline_*`` hook that does not exist (a typo) is refused with
``ValidationError``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import pluggy

from inferline.core import (
    DEFAULT_CATALOG,
    Backend,
    Hardware,
    HardwareCatalog,
    ModelConfig,
    NotFoundError,
    ValidationError,
)

from . import hookspecs
from .hookspecs import BackendFactory, PolicyFactory

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
        self._failed: dict[str, str] = {}
        self._origin: dict[str, str] = {}

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

    def load_entrypoints(self, group: str = ENTRYPOINT_GROUP) -> list[str]:
        """Register every entry point of ``group`` not registered or disabled yet; returns
        the names registered by this call (sorted)."""
        self._apply_disabled()
        added = []
        seen: set[str] = set()
        for ep in importlib.metadata.entry_points(group=group):
            if ep.name in seen:  # the same distribution seen twice on sys.path
                continue
            seen.add(ep.name)
            if self._pm.is_blocked(ep.name) or self._pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                self._failed[ep.name] = f"{type(e).__name__}: {e}"
                log.warning("inferline plugin %r (%s) failed to load: %s", ep.name, ep.value, e)
                continue
            dist = getattr(ep, "dist", None)
            origin = f"{ep.value}"
            if dist is not None:
                origin += f" ({dist.metadata['Name']} {dist.version})"
            if self._register(plugin, ep.name) is not None:
                self._failed.pop(ep.name, None)
                self._origin[ep.name] = origin
                added.append(ep.name)
        if added:
            log.debug("loaded inferline plugins %s", added)
        return sorted(added)

    def _register(self, plugin: Any, name: str | None) -> str | None:
        if name is not None and self._pm.get_plugin(name) is not None:
            if self._pm.get_plugin(name) is plugin:
                return name
            raise ValidationError("plugin name", "a name not registered yet", name)
        try:
            got = self._pm.register(plugin, name)
            self._pm.check_pending()
        except pluggy.PluginValidationError as e:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            raise ValidationError(
                f"plugin {name or plugin!r}", "valid inferline hooks", str(e)
            ) from None
        except ValueError as e:  # pluggy: already registered under another name
            raise ValidationError("plugin", "a plugin object registered once", str(e)) from None
        return got

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register ``plugin`` (a module or object with ``@hookimpl`` functions) under ``name``;
        returns the name, or None when the name is disabled."""
        self._apply_disabled()
        if name is not None and self._pm.is_blocked(name):
            log.info("plugin %r is disabled by %s", name, DISABLED_ENV)
            return None
        got = self._register(plugin, name)
        if got is not None:
            self._origin.setdefault(got, "register()")
        return got

    def unregister(self, name: str) -> None:
        plugin = self._pm.get_plugin(name)
        if plugin is None:
            raise NotFoundError("plugin", name, self.plugin_names())
        self._pm.unregister(plugin)
        self._origin.pop(name, None)

    def plugin_names(self) -> list[str]:
        return sorted(n for n, p in self._pm.list_name_plugin() if p is not None and n is not None)

    def failed(self) -> dict[str, str]:
        """Entry points that failed to import: name -> error."""
        return dict(self._failed)

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per plugin: where it came from and the hooks it implements (for ``inferline plugins``)."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.plugin_names():
            plugin = self._pm.get_plugin(name)
            hooks = sorted(
                c.name
                for c in self._pm.get_hookcallers(plugin) or []
                if c.name in hookspecs.HOOK_NAMES
            )
            out[name] = {"origin": self._origin.get(name, ""), "hooks": hooks}
        for name, err in self._failed.items():
            out[name] = {"origin": "", "hooks": [], "error": err}
        return out

    # -- provider hooks ---------------------------------------------------------------------

    def _provided(self, hook: str, what: str) -> dict[str, tuple[str, Any]]:
        """Merge the mappings every implementation of ``hook`` returns; a key two plugins map
        to different values is an error."""
        out: dict[str, tuple[str, Any]] = {}
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            result = impl.function()
            if not result:
                continue
            if not isinstance(result, Mapping):
                raise ValidationError(f"{hook} of plugin {impl.plugin_name!r}", "a mapping", result)
            for key, value in result.items():
                if not isinstance(key, str) or not key:
                    raise ValidationError(f"{what} name from {impl.plugin_name!r}", "a string", key)
                if what == "backend scheme":
                    key = key.lower()
                if key in out and out[key][1] is not value and out[key][1] != value:
                    raise ValidationError(
                        f"{what} {key!r}",
                        f"one provider (plugins {out[key][0]!r} and {impl.plugin_name!r} "
                        f"both offer it; disable one with {DISABLED_ENV})",
                        impl.plugin_name,
                    )
                out[key] = (impl.plugin_name, value)
        return out

    def _backend_factories(self) -> dict[str, tuple[str, BackendFactory]]:
        return self._provided("inferline_backend_schemes", "backend scheme")

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
            known: Any = sorted(factories)
            if self._failed:
                known = f"{known}; plugins that failed to load: {sorted(self._failed)}"
            raise NotFoundError("backend scheme", scheme, known)
        try:
            return factories[scheme][1](url, dict(options))
        except TypeError as e:
            # an option the backend does not take: a user's typo, not a crash
            if "unexpected keyword argument" not in str(e):
                raise
            bad = str(e).rsplit("argument", 1)[-1].strip(" '\"")
            raise ValidationError(
                f"backend option {bad!r}", f"an option {scheme}:// backends accept", options
            ) from None

    def hardware_catalog(self, base: HardwareCatalog = DEFAULT_CATALOG) -> HardwareCatalog:
        """``base`` with every plugin's hardware kinds merged in."""
        extra: dict[str, Hardware] = {}
        for name, (_plugin, hw) in self._provided(
            "inferline_hardware_kinds", "hardware kind"
        ).items():
            if not isinstance(hw, Hardware):
                raise ValidationError(f"hardware kind {name!r}", "an inferline.core.Hardware", hw)
            extra[name] = hw
        return base.merged(HardwareCatalog(extra))

    def selection_policies(self) -> dict[str, PolicyFactory]:
        """Selection policy factories by name, from every plugin."""
        return {
            k: v
            for k, (_p, v) in self._provided(
                "inferline_selection_policies", "selection policy"
            ).items()
        }

    def selection_policy(self, name: str, models: Any, *, rng: Any = None, **params: Any) -> Any:
        """A new selection policy ``name`` over ``models`` (``factory(models, rng=rng, **params)``)."""
        factories = self.selection_policies()
        if name not in factories:
            raise NotFoundError("selection policy", name, sorted(factories))
        return factories[name](models, rng=rng, **params)

    # -- observer hooks ---------------------------------------------------------------------

    def _notify(self, hook: str, kwargs: dict[str, Any]) -> int:
        """Call every implementation of an observer hook with the arguments it asks for;
        returns how many ran without raising. Errors are logged, never raised."""
        ok = 0
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            try:
                impl.function(*[kwargs[a] for a in impl.argnames])
                ok += 1
            except Exception:
                log.exception("plugin %r failed in %s", impl.plugin_name, hook)
        return ok

    def notify_config(
        self,
        model: str,
        old: ModelConfig | None,
        new: ModelConfig | None,
        *,
        backend: str = "",
        reason: str = "",
    ) -> int:
        """Tell observers that ``model``'s configuration changed (``inferline_on_config_change``)."""
        return self._notify(
            "inferline_on_config_change",
            {"model": model, "old": old, "new": new, "backend": backend, "reason": reason},
        )

    def notify_scaling(
        self,
        model: str,
        replicas_before: int,
        replicas_after: int,
        *,
        time_s: float = 0.0,
        reason: str = "",
        source: str = "tuner",
    ) -> int:
        """Tell observers about a scaling decision (``inferline_on_scaling_decision``)."""
        return self._notify(
            "inferline_on_scaling_decision",
            {
                "model": model,
                "replicas_before": int(replicas_before),
                "replicas_after": int(replicas_after),
                "time_s": float(time_s),
                "reason": reason,
                "source": source,
            },
        )

    def scaling_observer(self, source: str = "tuner") -> Callable[..., int]:
        """A callback ``(model, before, after, time_s=..., reason=...)`` bound to ``source``,
        for controllers that take a plain function instead of a host."""

        def observe(model: str, before: int, after: int, **kw: Any) -> int:
            return self.notify_scaling(model, before, after, source=source, **kw)

        return observe

"""Where the plugin host and backends are made: the two functions every part of inferline
that needs one goes through (the composition root ``_build``, ``Deployment.open_backend``,
the CLI's verbs). Kept apart from ``_build`` so that the deployment format can open its own
backend without importing the root (``measure`` profiles through ``dep.open_backend()``:
it sits below ``deploy`` and builds nothing itself)."""

from __future__ import annotations

from typing import Any

__all__ = ["open_backend", "plugin_host"]


def plugin_host() -> Any:
    """The plugin host of this process: built-in adapters plus the installed plugins (entry
    point group ``inferline``). Entry points call this once and pass the host down."""
    from inferline.adapters import PluginHost

    return PluginHost.default()


def open_backend(host: Any, url: str, **options: Any) -> Any:
    """The backend ``url`` names (``local://``, ``triton://``, ``tfserving://``, ``ray://``
    or a plugin's scheme), through ``host``'s adapters."""
    return host.backend_for(url, **options)

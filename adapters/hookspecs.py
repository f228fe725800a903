"""The hooks an inferline plugin may implement (pluggy project name ``inferline``).

A plugin is a module or object with functions marked ``@hookimpl`` (``from inferline.adapters
import hookimpl``); it is found through the ``inferline`` entry-point group::

    [project.entry-points.inferline]
    mybackend = "mypackage.inferline_plugin"

and loaded by ``PluginHost.load_entrypoints()``. Every hook's name starts with ``inferline_``.
The built-in adapters register through exactly this path.

This is the minimal first version; the adapters issue adds hooks for selection policies and
for observing configuration changes and scaling decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from inferline.core import Backend, Hardware

__all__ = ["BackendFactory", "hookimpl", "hookspec"]

PROJECT = "inferline"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

BackendFactory = Callable[[str, Mapping[str, Any]], Backend]
"""Creates a backend from its URL (e.g. ``triton://host:8001``) and keyword options."""


@hookspec
def inferline_backend_schemes() -> Mapping[str, BackendFactory]:
    """The backends this plugin provides, by URL scheme.

    Return ``{"scheme": factory}``; ``factory(url, options)`` gets the full URL and a dict of
    options (from ``PluginHost.backend_for(url, **options)``) and returns an object satisfying
    ``inferline.core.Backend``. A scheme offered by two plugins is an error; block one of them
    with ``INFERLINE_DISABLED_PLUGINS``.
    """
    raise NotImplementedError


@hookspec
def inferline_hardware_kinds() -> Mapping[str, Hardware]:
    """Hardware kinds this plugin adds to the catalog, by catalog name (e.g. ``"gpu-a100"``).

    They are merged over ``inferline.core.DEFAULT_CATALOG``; a name offered by two plugins with
    different prices is an error.
    """
    raise NotImplementedError

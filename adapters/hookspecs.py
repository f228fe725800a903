"""The hooks an inferline plugin may implement (pluggy project name ``inferline``).

A plugin is a module or object with functions marked ``@hookimpl`` (``from inferline.adapters
import hookimpl``); it is found through the ``inferline`` entry-point group::

    [project.entry-points.inferline]
    mybackend = "mypackage.inferline_plugin"

and loaded by ``PluginHost.load_entrypoints()``. Every hook's name starts with ``inferline_``.
The built-in adapters (``local``, ``triton``, ``tfserving``) register through exactly this path.

Two kinds of hooks:

* **providers** return a mapping by name (backend URL schemes, hardware kinds, selection
  policies); the host merges the answers of every plugin and refuses a name two plugins offer
  differently;
* **observers** (``inferline_on_*``) are told about events and return nothing; an observer that
  raises is logged and skipped, it never breaks the tuner or a deployment.

As with any pluggy hook, an implementation may accept only some of the arguments, by name
(``def inferline_on_scaling_decision(model, replicas_after): ...``), so arguments added to an
observer later do not break existing plugins. ``PluginHost`` is the only code that calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

from inferline.core import Backend, Hardware, ModelConfig

__all__ = [
    "HOOK_NAMES",
    "PROJECT",
    "BackendFactory",
    "PolicyFactory",
    "hookimpl",
    "hookspec",
]

PROJECT = "inferline"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

BackendFactory = Callable[[str, Mapping[str, Any]], Backend]
"""Creates a backend from its URL (e.g. ``triton://host:8001``) and keyword options."""

PolicyFactory = Callable[..., Any]
"""Creates a selection policy: ``factory(models, rng=random.Random | None, **params)`` returns
an object with the ``inferline.selection.SelectionPolicy`` protocol (``init``, ``select``,
``combine``, ``observe``, ``state_from_dict``)."""


# ---------------------------------------------------------------- providers


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


@hookspec
def inferline_selection_policies() -> Mapping[str, PolicyFactory]:
    """Model-selection policies this plugin provides, by policy name (e.g. ``"exp3"``).

    ``factory(models, rng=None, **params)`` returns a policy object (see ``PolicyFactory``).
    The built-in policies of ``inferline.selection`` are registered through this hook too; a
    name offered by two plugins with different factories is an error.
    """
    raise NotImplementedError


# ---------------------------------------------------------------- observers


@hookspec
def inferline_on_config_change(
    model: str,
    old: ModelConfig | None,
    new: ModelConfig | None,
    backend: str,
    reason: str,
) -> None:
    """A model's configuration changed on a backend (deployed, rescaled, moved, removed).

    ``old`` is None for a new deployment, ``new`` is None for a removal; ``backend`` is the
    backend's URL and ``reason`` a short human-readable cause (``"plan applied"``,
    ``"attach"``, ``"tuner"``). Called after the change took effect.
    """


@hookspec
def inferline_on_scaling_decision(
    model: str,
    replicas_before: int,
    replicas_after: int,
    time_s: float,
    reason: str,
    source: str,
) -> None:
    """A controller decided to change a model's replica count.

    ``time_s`` is the decision time on the controller's clock, ``reason`` its explanation
    (the tuner's ``reason`` string), ``source`` who decided (``"tuner"``, ``"autoscale"``,
    ``"operator"``). Called when the decision is made, before the backend finishes scaling.
    """


HOOK_NAMES = (
    "inferline_backend_schemes",
    "inferline_hardware_kinds",
    "inferline_selection_policies",
    "inferline_on_config_change",
    "inferline_on_scaling_decision",
)

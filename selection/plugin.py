"""Registers the built-in selection policies through the plugin host (entry point
``inferline:selection``), exactly as a third-party plugin would.

``selection/`` may not import ``adapters/`` (dependencies point inward), so the hook marker is
made here from the same pluggy project name; pluggy matches markers by that name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

from ._bandits import BUILTIN_POLICIES

__all__ = ["inferline_selection_policies"]

hookimpl = pluggy.HookimplMarker("inferline")


@hookimpl
def inferline_selection_policies() -> dict[str, Callable[..., Any]]:
    """``name -> factory(models, rng=None, **params)`` for every built-in policy (Rafiki's
    actor-critic selector too; it imports torch only when constructed)."""
    from ._rafiki_policy import RafikiPolicy

    return {**BUILTIN_POLICIES, "rafiki": RafikiPolicy}

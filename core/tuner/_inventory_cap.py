"""A controller wrapper that holds a simulated tuner to the deployment's inventory.

The live tuner scales through the backend, which refuses a scale-up it has no room for
(``CapacityError``); the tuner then starts as many replicas as fit and retries the whole
target later, unless a newer decision replaced it (``inferline/deploy/_tuning.py``). A simulated
tuner has no backend to refuse it, so without this wrapper ``simulate --tuner`` would scale
past the cores and GPUs the deployment has and report a latency no deployment can reach.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._hardware import HardwareCatalog
from .._plan import ModelConfig
from ..estimator import Controller, StageSwitch, SystemState
from ..planning import PlannerOptions, over_inventory

__all__ = ["InventoryCap"]

Room = Callable[[Mapping[str, int]], bool]


@dataclass
class InventoryCap:
    """Pass ``controller``'s decisions on, each scale-up cut to the most replicas ``room``
    accepts given every model's count (active + pending) at that moment: decisions that shrink
    a model first, then the others in decision order.
    A cut target is asked for again at every later call until it fits or a newer decision
    for that model replaces it. ``capped`` counts the cut decisions. Variant switches pass
    unchanged. Other attributes are the wrapped controller's."""

    controller: Controller
    room: Room
    capped: int = 0
    _wanted: dict[str, int | ModelConfig] = field(default_factory=dict)

    @classmethod
    def for_plan(
        cls,
        controller: Controller,
        configs: Mapping[str, ModelConfig],
        catalog: HardwareCatalog,
        options: PlannerOptions,
    ) -> InventoryCap:
        """Room as the planner counts it (``options.inventory``, ``replica_units``,
        ``gpu_host_units``) for the plan's hardware."""

        def room(counts: Mapping[str, int]) -> bool:
            cfg = {m: replace(configs[m], replicas=n) for m, n in counts.items()}
            return over_inventory(cfg, catalog, options) is None

        return cls(controller, room)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.controller, name)

    @property
    def interval_s(self) -> float:
        return float(self.controller.interval_s)

    def observe(
        self, now_s: float, arrivals: np.ndarray, state: SystemState
    ) -> Mapping[str, Any] | None:
        want = dict(self.controller.observe(now_s, arrivals, state) or {})
        for m in want:
            self._wanted.pop(m, None)  # a newer decision replaces a cut one
        todo = [*want.items(), *self._wanted.items()]
        if not todo:
            return None
        counts = {m: state.active_replicas[m] + state.pending_replicas[m] for m in state.queued}

        def grows(item: tuple[str, Any]) -> bool:
            m, v = item
            if isinstance(v, StageSwitch):
                return False
            return (v.replicas if isinstance(v, ModelConfig) else int(v)) > counts[m]

        out: dict[str, Any] = {}
        # what shrinks first (it frees room), then new decisions before retried ones
        for m, v in sorted(todo, key=grows):
            if isinstance(v, StageSwitch):
                out[m] = v
                continue
            n = v.replicas if isinstance(v, ModelConfig) else int(v)
            fit = n
            while fit > counts[m] and not self.room({**counts, m: fit}):
                fit -= 1
            if fit < n:
                self._wanted[m] = v
                if m in want:
                    self.capped += 1
            else:
                self._wanted.pop(m, None)
            counts[m] = max(fit, 0)
            out[m] = replace(v, replicas=fit) if isinstance(v, ModelConfig) else fit
        return out

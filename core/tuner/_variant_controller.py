"""The variant-aware tuner (``VariantTuner``) as the estimator's in-the-loop controller.

``simulate(..., controller=VariantController.from_plan(plan), variants=ctl.stage_variants)``
simulates a plan made with model variants with the tuner that may switch stages, as the live
tuner does (``inferline serve``): a switch starts the new variant's replicas, which take the
stage over after the activation delay, when the old variant's replicas leave
(``StageSwitch`` of the estimator).

The estimator serves a stage from its own profile, which for a plan made with variants is the
profile of the variant the plan chose (``stage_profiles``); a switch back to that variant is
a switch to the stage's own profile, named by the stage (what ``StageSwitch`` expects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._envelope import OnlineEnvelope
from .._plan import ModelConfig, Plan
from ..estimator import StageSwitch
from ._config import TunerConfig
from ._state import TunerDecision
from ._variants import VariantDecision, VariantTuner

__all__ = ["VariantController"]


class VariantController:
    """``VariantTuner`` fed by the estimator's arrivals every ``config.interval_s``."""

    def __init__(self, tuner: VariantTuner, start_s: float = 0.0) -> None:
        self.tuner = tuner
        self.interval_s = tuner.config.interval_s
        self.state = tuner.initial_state(start_s)
        self.envelope = OnlineEnvelope(tuner.windows, tuner.config.resolution_s)
        self.decisions: list[TunerDecision] = []
        self.variant_decisions: list[VariantDecision] = []
        self._plan_choice = dict(tuner.choice)
        self._hardware = {m: c.hardware for m, c in tuner.plan.models.items()}

    @classmethod
    def from_plan(
        cls, plan: Plan, config: TunerConfig | None = None, start_s: float = 0.0, **kw: Any
    ) -> VariantController:
        """The controller of a plan made with variants (``Plan.variants``)."""
        return cls(VariantTuner.from_plan(plan, config, **kw), start_s)

    @property
    def stage_variants(self) -> dict[str, tuple[str, ...]]:
        """What to pass to ``simulate(variants=)``: every variant stage's other variants."""
        out = {}
        for stage, sv in self.tuner.variants.stages.items():
            names = tuple(v.name for v in sv.variants if v.name != self._plan_choice[stage])
            if names:
                out[stage] = names
        return out

    def observe(
        self, now_s: float, new_arrivals: npt.NDArray[np.float64], state: Any = None
    ) -> dict[str, Any] | None:
        self.envelope.extend(new_arrivals)
        self.state, vd = self.tuner.step(self.state, now_s, self.envelope.take_peaks())
        if vd is None:
            return None
        d = vd.decision
        self.decisions.append(d)
        self.variant_decisions.append(vd)
        batch = {
            m: int(d.batch.get(m, c.max_batch_size)) for m, c in self.tuner.plan.models.items()
        }
        out: dict[str, Any] = {}
        for m, n in d.replicas.items():
            cfg = ModelConfig(self._hardware[m], batch[m], n)
            if m in vd.switched:
                new = vd.switched[m][1]
                out[m] = StageSwitch(m if new == self._plan_choice.get(m) else new, cfg)
            else:
                out[m] = cfg if d.batch else n
        return out

    def named(
        self, switches: Sequence[tuple[float, str, str]]
    ) -> tuple[tuple[float, str, str], ...]:
        """A ``SimResult.variant_switches`` with a switch back to a stage's own profile named
        by the plan's variant (what it is), for reports."""
        return tuple((t, s, self._plan_choice.get(s, v) if v == s else v) for t, s, v in switches)

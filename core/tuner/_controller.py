"""The tuner with a clock: :class:`Tuner` (a policy, its online envelope and its state, fed
arrival times and the time by its caller) and :class:`InferLineController` (the tuner in the
estimator's loop, ``simulate(..., controller=)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .._envelope import OnlineEnvelope
from .._plan import ModelConfig, Plan
from ._config import TunerConfig
from ._policy import TunerPolicy
from ._state import TunerDecision, TunerState

__all__ = ["InferLineController", "Tuner"]


@dataclass
class Tuner:
    """A policy with its online envelope and state: feed arrival times, call :meth:`tick`.

    Not pure (it holds the envelope and state) but clock-free: the caller passes the time.
    """

    policy: TunerPolicy
    start_s: float = 0.0
    state: TunerState = field(init=False)
    envelope: OnlineEnvelope = field(init=False)
    decisions: list[TunerDecision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.policy.initial_state(self.start_s)
        self.envelope = OnlineEnvelope(self.policy.windows, self.policy.config.resolution_s)

    @classmethod
    def from_plan(
        cls,
        plan: Plan,
        config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
        start_s: float = 0.0,
    ) -> Tuner:
        return cls(TunerPolicy.from_plan(plan, config), start_s)

    @property
    def replicas(self) -> dict[str, int]:
        return dict(self.state.replicas)

    def record(self, arrivals: npt.ArrayLike) -> None:
        self.envelope.extend(arrivals)

    def tick(self, now_s: float) -> TunerDecision | None:
        self.state, decision = self.policy.step(self.state, now_s, self.envelope.take_peaks())
        if decision is not None:
            self.decisions.append(decision)
        return decision


class InferLineController:
    """The tuner as the estimator's in-the-loop controller (``simulate(..., controller=)``)."""

    def __init__(
        self,
        plan: Plan,
        config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
        start_s: float = 0.0,
    ) -> None:
        self.interval_s = config.interval_s
        self.tuner = Tuner.from_plan(plan, config, start_s)
        self._hardware = {m: c.hardware for m, c in plan.models.items()}

    @property
    def decisions(self) -> list[TunerDecision]:
        return self.tuner.decisions

    def observe(
        self, now_s: float, new_arrivals: npt.NDArray[np.float64], state: Any = None
    ) -> dict[str, Any] | None:
        """Replica counts, or ``ModelConfig`` values when the tuner manages batch sizes."""
        self.tuner.record(new_arrivals)
        d = self.tuner.tick(now_s)
        if d is None:
            return None
        if not d.batch:
            return dict(d.replicas)
        return {m: ModelConfig(self._hardware[m], d.batch[m], n) for m, n in d.replicas.items()}

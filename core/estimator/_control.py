"""The estimator's controller interface: what a tuner in the loop sees and may answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .._plan import ModelConfig

__all__ = ["Controller", "StageSwitch", "SystemState"]


@dataclass(frozen=True)
class SystemState:
    """What a controller sees at a decision time (per model, keyed by model name)."""

    now_s: float
    queued: Mapping[str, int]
    in_service: Mapping[str, int]
    active_replicas: Mapping[str, int]
    pending_replicas: Mapping[str, int]
    in_system: int


@dataclass(frozen=True)
class StageSwitch:
    """A controller's value for a stage: serve it with model ``variant`` (one of the stage's
    variants given to :func:`simulate`) as ``config`` (on the stage's hardware).

    As the live tuner does it: ``config.replicas`` replicas of the variant are billed at once
    and serve after the activation delay, with ``config.max_batch_size``; the previous
    variant's replicas serve the stage's queue until then and leave at that time (busy ones
    after their batch). ``variant`` may be the stage's own name: its own profile (for a plan
    made with variants, the variant the plan chose).
    """

    variant: str
    config: ModelConfig


class Controller(Protocol):
    """A tuner in the loop: called every ``interval_s`` of simulated time.

    ``new_arrivals`` are the pipeline arrivals since the previous call (``[prev, now)``); the
    state reflects every event strictly before ``now_s``. Return desired absolute replica
    counts (only the models to change) or None. A value may also be a ``ModelConfig`` on the
    configured hardware: its ``max_batch_size`` applies to the next batch the model forms
    (at once; batches in service finish as they are), its ``replicas`` as a count; or a
    :class:`StageSwitch` to another variant of the stage.
    """

    interval_s: float

    def observe(
        self, now_s: float, new_arrivals: np.ndarray, state: SystemState
    ) -> Mapping[str, int] | None: ...

"""Tuning: keeping a planned pipeline within its SLO as the traffic changes.

Where things are:

* ``_policy.py``: InferLine's tuner (§5), the pure decision rule :class:`TunerPolicy`, with
  the paper's replica scaling; ``_ladder_rule.py``: its ladder rule (configurations from the
  plan's re-plans for higher rates, an extension), the base of :class:`TunerPolicy`;
* ``_config.py``: :class:`TunerConfig`; ``_state.py``: :class:`TunerDecision`,
  :class:`TunerState`;
* ``_controller.py``: the policy with a clock (:class:`Tuner`) and in the estimator's loop
  (:class:`InferLineController`);
* ``_variants.py``: switching stages to other model variants (:class:`VariantTuner`), and
  ``_variant_controller.py`` its controller in the estimator's loop;
* ``_autoscale.py``: the coarse-grained AutoScale baseline of InferLine's evaluation;
* ``_inventory_cap.py``: a simulated tuner held to the deployment's inventory
  (:class:`InventoryCap`).
"""

from ._autoscale import (
    AutoScaleConfig,
    AutoScaleController,
    AutoScaleDecision,
    AutoScalePolicy,
    AutoScaleState,
    packing_factor,
    pipeline_unit,
)
from ._config import TunerConfig
from ._controller import InferLineController, Tuner
from ._inventory_cap import InventoryCap
from ._policy import TunerPolicy
from ._state import TunerDecision, TunerState
from ._variant_controller import VariantController
from ._variants import VariantDecision, VariantTuner

__all__ = [
    "AutoScaleConfig",
    "AutoScaleController",
    "AutoScaleDecision",
    "AutoScalePolicy",
    "AutoScaleState",
    "InferLineController",
    "InventoryCap",
    "Tuner",
    "TunerConfig",
    "TunerDecision",
    "TunerPolicy",
    "TunerState",
    "VariantController",
    "VariantDecision",
    "VariantTuner",
    "packing_factor",
    "pipeline_unit",
]

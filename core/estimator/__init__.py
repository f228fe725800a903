"""Discrete-event latency estimator (the contract in docs/design.md "The estimator contract").

One EDF queue per model, pull-based identical replicas taking ``min(max_batch_size, queued)``
queries at once, all arrivals and completions of an instant applied before any replica takes
a batch, fan-out to visited children, joins on the last visited parent, seeded conditional
visits. Optional: per-hop overhead, delayed batching, replica activation delay, replica-count
schedules and a controller (tuner) called every ``interval_s`` of simulated time, which may
also switch a stage to another model variant (:class:`StageSwitch`). Per model, the serving
system's own batcher may replace the estimator's batching (``EstimatorOptions.server_batchers``:
:class:`TritonBatcher`, Triton's dynamic batcher with its queue timeout, whose rejections are
``SimResult.rejected``; :class:`TFServingBatcher`, TF Serving's batch scheduler with padding
to allowed sizes, whose refusals are ``SimResult.refused``).

Where things are:

* ``_simulate.py``: :func:`simulate`, which drives the kernel segment by segment (between
  schedule entries and controller calls) and summarizes the result;
* ``_estimator_kernel.py``: the compiled event loop (numba);
* ``_options.py``: :class:`EstimatorOptions`; ``_results.py``: :class:`SimResult`;
  ``_control.py``: the controller interface (:class:`Controller`, :class:`SystemState`,
  :class:`StageSwitch`);
* ``_batchers.py``: :class:`TritonBatcher`, :class:`TFServingBatcher` (their rules) and
  :func:`batcher_from_dict`;
* ``_stop.py``: :class:`EarlyStop`, ``simulate(stop=...)``: end a run once its percentile
  latency is certain to exceed the SLO (the planner's infeasible candidates);
* ``_admission.py``: :class:`EstimatorAdmission` (``EstimatorOptions.admission``) and the
  admission arithmetic the live queue shares (:func:`predict_completion`);
* ``_prepare.py``: inputs checked and laid out as the kernel's arrays; ``_state.py``: the
  kernel's state (created, grown, read back); ``_draws.py``: the seeded visit and
  service-spread draws.
"""

from ._admission import DEFAULT_BUFFER_S, EstimatorAdmission, dispatch_late, predict_completion
from ._batchers import ServerBatcher, TFServingBatcher, TritonBatcher, batcher_from_dict
from ._control import Controller, StageSwitch, SystemState
from ._draws import SPREAD_Z_CLIP, draw_visits, spread_floor, spread_params
from ._options import MAX_SHARERS_PER_UNIT, EstimatorOptions
from ._results import ModelSimStats, SimResult
from ._simulate import simulate, simulate_plan
from ._stop import EarlyStop, miss_allowance

__all__ = [
    "DEFAULT_BUFFER_S",
    "MAX_SHARERS_PER_UNIT",
    "SPREAD_Z_CLIP",
    "Controller",
    "EarlyStop",
    "EstimatorAdmission",
    "EstimatorOptions",
    "ModelSimStats",
    "ServerBatcher",
    "SimResult",
    "StageSwitch",
    "SystemState",
    "TFServingBatcher",
    "TritonBatcher",
    "batcher_from_dict",
    "dispatch_late",
    "draw_visits",
    "miss_allowance",
    "predict_completion",
    "simulate",
    "simulate_plan",
    "spread_floor",
    "spread_params",
]

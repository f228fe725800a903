"""The estimator's options: the departures from the ideal system that the live one has."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._validate import as_float, as_int, as_mapping, as_str, no_extra_keys
from ..errors import ValidationError
from ._admission import EstimatorAdmission
from ._batchers import ServerBatcher, TFServingBatcher, TritonBatcher, batcher_from_dict

__all__ = ["MAX_SHARERS_PER_UNIT", "EstimatorOptions"]

# Replicas that may share one core (or GPU) of a shared or pinned pool, at most: the planner
# grows a model no further there, and the bundled runtime refuses more when oversubscribing.
MAX_SHARERS_PER_UNIT = 16


@dataclass(frozen=True)
class EstimatorOptions:
    """Departures from the ideal system that the live one has (all off by default).

    ``hop_overhead_s``: fixed time before a query enters each model's queue (RPC per hop).
    ``batch_wait_s``: per model, an idle replica with fewer than ``max_batch_size`` queued
    starts only when the batch fills or the oldest queued query has waited this long. A
    model whose ``ModelConfig.batch_wait_ms`` is above 0 (a plan's wait) uses that instead.
    ``activation_delay_s``: time from requesting a replica to it serving.
    ``seed``: seed of the conditional-visit draws.
    ``wake_up``: a batch that starts on an idle replica also takes the profiled wake-up extra
    for that idle time (``Profiles.wake_up``; nothing where a pair has none).
    ``service_spread``: each batch's service time is drawn (seeded by ``seed``) from a
    log-normal through the profile's ``p50_s`` and ``p99_s`` for its size, clipped at its
    0.1th and 99.9th percentiles, instead of taking ``latency_s``. Batch sizes profiled
    without both quantiles (or with ``p99_s <= p50_s``) keep ``latency_s``.
    ``shared_units``: hardware name -> the units (cores, GPUs) that *all* replicas placed on
    it share, as when replicas outnumber a machine's cores. A busy replica takes
    ``replica_units`` of them (per model, its threads; default 1); while the busy replicas
    take more than there are, every one runs at the same fraction of its profiled speed
    (processor sharing). ``pinned_cores``: hardware name -> cores its replicas are pinned
    to, each replica to the least-used core (the lowest on ties) when it is requested, as
    the bundled runtime places them: the replicas on one core share it. A pinned replica is
    modelled on one core (threads beyond the first are not). Hardware named in neither gives
    each replica units of its own (the paper's cloud, the default).
    ``server_batchers``: model -> the serving system's own batcher for it
    (:class:`TritonBatcher`, :class:`TFServingBatcher`; rules in ``_batchers.py``): that
    model is batched by the server's rules and may reject or refuse queries
    (``SimResult.rejected``, ``SimResult.refused``). Models not named keep the estimator's.
    ``admission``: the live queue's admission by predicted completion and Clockwork's
    dispatch rule (:class:`EstimatorAdmission`, docs/deadlines.md) at every model without a
    server batcher; refused queries never finish (``SimResult.refused_late``). ``None``, the
    default, is the estimator without it. Not with a batch wait (delayed batching).
    """

    hop_overhead_s: float = 0.0
    batch_wait_s: Mapping[str, float] = field(default_factory=dict)
    activation_delay_s: float = 0.0
    seed: int = 0
    wake_up: bool = True
    service_spread: bool = False
    shared_units: Mapping[str, float] = field(default_factory=dict)
    replica_units: Mapping[str, float] = field(default_factory=dict)
    pinned_cores: Mapping[str, int] = field(default_factory=dict)
    server_batchers: Mapping[str, ServerBatcher] = field(default_factory=dict)
    admission: EstimatorAdmission | None = None

    def __post_init__(self) -> None:
        as_float(self.hop_overhead_s, "hop_overhead_s", nonneg=True)
        as_float(self.activation_delay_s, "activation_delay_s", nonneg=True)
        as_int(self.seed, "seed", minimum=0)
        if not isinstance(self.wake_up, bool):
            raise ValidationError("wake_up", "true or false", self.wake_up)
        if not isinstance(self.service_spread, bool):
            raise ValidationError("service_spread", "true or false", self.service_spread)
        as_mapping(self.batch_wait_s, "batch_wait_s")
        for k, v in self.batch_wait_s.items():
            as_float(v, f"batch_wait_s.{k}", nonneg=True)
        object.__setattr__(self, "batch_wait_s", dict(self.batch_wait_s))
        for name in ("shared_units", "replica_units"):
            object.__setattr__(self, name, _positive_map(getattr(self, name), name))
        pinned = {
            as_str(k, "pinned_cores"): as_int(v, f"pinned_cores.{k}", minimum=1)
            for k, v in as_mapping(self.pinned_cores, "pinned_cores").items()
        }
        object.__setattr__(self, "pinned_cores", pinned)
        for hw in pinned:
            if hw in self.shared_units:
                raise ValidationError(
                    f"pinned_cores.{hw}", "hardware not also in shared_units", pinned[hw]
                )
        batchers = {}
        for k, b in as_mapping(self.server_batchers, "server_batchers").items():
            where = f"server_batchers.{as_str(k, 'server_batchers')}"
            if not isinstance(b, TritonBatcher | TFServingBatcher):
                raise ValidationError(where, "a TritonBatcher or TFServingBatcher", b)
            batchers[k] = b.check(f"{where}.")
        object.__setattr__(self, "server_batchers", batchers)
        if self.admission is not None and not isinstance(self.admission, EstimatorAdmission):
            raise ValidationError("admission", "an EstimatorAdmission or None", self.admission)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hop_overhead_s": self.hop_overhead_s,
            "batch_wait_s": dict(self.batch_wait_s),
            "activation_delay_s": self.activation_delay_s,
            "seed": self.seed,
            "wake_up": self.wake_up,
            "service_spread": self.service_spread,
            "shared_units": dict(self.shared_units),
            "replica_units": dict(self.replica_units),
            "pinned_cores": dict(self.pinned_cores),
        }
        if self.server_batchers:  # only when set: documents from before stay as they were
            out["server_batchers"] = {k: b.to_dict() for k, b in self.server_batchers.items()}
        if self.admission is not None:  # the same: only when set
            out["admission"] = self.admission.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Any) -> EstimatorOptions:
        m = as_mapping(d, "options")
        no_extra_keys(
            m,
            {
                "hop_overhead_s",
                "batch_wait_s",
                "activation_delay_s",
                "seed",
                "wake_up",
                "service_spread",
                "shared_units",
                "replica_units",
                "pinned_cores",
                "server_batchers",
                "admission",
            },
            "",
        )
        adm = m.get("admission")
        batchers = {
            k: batcher_from_dict(v, f"server_batchers.{k}")
            for k, v in as_mapping(m.get("server_batchers", {}), "server_batchers").items()
        }
        return cls(
            hop_overhead_s=as_float(m.get("hop_overhead_s", 0.0), "hop_overhead_s", nonneg=True),
            batch_wait_s={
                str(k): as_float(v, f"batch_wait_s.{k}", nonneg=True)
                for k, v in as_mapping(m.get("batch_wait_s", {}), "batch_wait_s").items()
            },
            activation_delay_s=as_float(
                m.get("activation_delay_s", 0.0), "activation_delay_s", nonneg=True
            ),
            seed=as_int(m.get("seed", 0), "seed", minimum=0),
            wake_up=m.get("wake_up", True),
            service_spread=m.get("service_spread", False),
            shared_units=m.get("shared_units", {}),
            replica_units=m.get("replica_units", {}),
            pinned_cores=m.get("pinned_cores", {}),
            server_batchers=batchers,
            admission=None if adm is None else EstimatorAdmission.from_dict(adm),
        )


def _positive_map(m: Any, where: str) -> dict[str, float]:
    return {
        as_str(k, where): as_float(v, f"{where}.{k}", positive=True)
        for k, v in as_mapping(m, where).items()
    }

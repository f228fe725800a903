"""What a simulation returns: every query's latency, per-model figures, cost and timelines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import as_int, as_mapping, no_extra_keys

__all__ = ["ModelSimStats", "SimResult"]


@dataclass(frozen=True)
class ModelSimStats:
    """Per-model figures of one simulation.

    ``utilization``: busy replica-seconds over serving replica-seconds between the first
    arrival and the last event. Queue delay: from entering the queue to the batch starting.
    """

    visits: int
    batches: int
    mean_batch_size: float
    utilization: float
    mean_queue_delay_s: float
    p99_queue_delay_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "visits": self.visits,
            "batches": self.batches,
            "mean_batch_size": self.mean_batch_size,
            "utilization": self.utilization,
            "mean_queue_delay_s": self.mean_queue_delay_s,
            "p99_queue_delay_s": self.p99_queue_delay_s,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> ModelSimStats:
        m = as_mapping(d, where)
        no_extra_keys(m, set(cls.__dataclass_fields__), where)
        return cls(
            visits=as_int(m["visits"], f"{where}.visits", minimum=0),
            batches=as_int(m["batches"], f"{where}.batches", minimum=0),
            mean_batch_size=float(m["mean_batch_size"]),
            utilization=float(m["utilization"]),
            mean_queue_delay_s=float(m["mean_queue_delay_s"]),
            p99_queue_delay_s=float(m["p99_queue_delay_s"]),
        )


def _pct_key(p: float) -> str:
    return f"latency_p{float(p):g}_s"


@dataclass(frozen=True, eq=False)
class SimResult:
    """Per-query latencies (arrival order; inf for a query that never finished) and stats.

    ``replica_timeline``: ``(time_s, model, serving replicas)`` at the start and at every
    change. ``cost_per_hour``: replica cost integrated from request to removal, averaged over
    the trace span (first to last arrival). ``variant_switches``: ``(time_s, stage, variant)``
    for every :class:`StageSwitch` a controller made (at the decision; the variant serves
    from the activation delay later). ``rejected`` / ``refused``: per query, whether a server
    batcher (``EstimatorOptions.server_batchers``) rejected it (Triton's queue timeout) or
    refused it (TF Serving's full batch queue); such a query never finishes (latency inf).
    All false without server batchers. ``refused_late``: per query, whether admission
    (``EstimatorOptions.admission``) refused it, at arrival at a model or when a batch was
    cut; such a query never finishes either (latency inf; all false without admission).

    ``stopped_early``: the run had ``simulate(stop=EarlyStop(slo_s, p))`` and stopped at
    simulated time ``stopped_at_s``, once ``certain_misses`` (more than the allowance) had
    certainly missed ``slo_s``: its ``p``-th latency is above ``slo_s``, nothing more is known.
    Queries not finished by then have latency inf (``miss_rate`` counts them), the per-model
    figures cover the run up to the stop, and :meth:`percentile` is inf. A run with
    ``stop`` that does not stop is the full run; ``certain_misses`` is then the misses counted
    on the way (at most the run's misses).
    """

    arrivals_s: np.ndarray
    latencies_s: np.ndarray
    models: Mapping[str, ModelSimStats]
    cost_per_hour: float
    replica_timeline: tuple[tuple[float, str, int], ...] = ()
    variant_switches: tuple[tuple[float, str, str], ...] = ()
    rejected: np.ndarray | None = None  # None: none (all false)
    refused: np.ndarray | None = None
    refused_late: np.ndarray | None = None
    stopped_early: bool = False
    stopped_at_s: float | None = None
    certain_misses: int | None = None  # None: no early stop asked for

    def __post_init__(self) -> None:
        for name in ("rejected", "refused", "refused_late"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(self.latencies_s.shape[0], dtype=bool))

    def percentile(self, p: float = 99.0) -> float:
        if self.stopped_early:  # only known to be above the stop's SLO
            return math.inf
        if self.latencies_s.size == 0:
            return 0.0
        return float(np.percentile(self.latencies_s, p))

    def miss_rate(self, slo_s: float) -> float:
        if self.latencies_s.size == 0:
            return 0.0
        return float(np.count_nonzero(self.latencies_s > slo_s) / self.latencies_s.size)

    def summary(self, slo_s: float, percentile: float = 99.0) -> dict[str, Any]:
        """The figures as JSON; ``rejected_queries`` and ``refused_queries`` only where a
        server batcher dropped some, ``refused_late_queries`` only where admission refused
        some (summaries without them stay as they were)."""
        out: dict[str, Any] = {
            _pct_key(percentile): self.percentile(percentile),
            "slo_miss_rate": self.miss_rate(slo_s),
            "cost_per_hour": self.cost_per_hour,
            "queries": int(self.latencies_s.size),
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }
        assert self.rejected is not None and self.refused is not None
        if self.rejected.any() or self.refused.any():
            out["rejected_queries"] = int(np.count_nonzero(self.rejected))
            out["refused_queries"] = int(np.count_nonzero(self.refused))
        assert self.refused_late is not None
        if self.refused_late.any():
            out["refused_late_queries"] = int(np.count_nonzero(self.refused_late))
        return out

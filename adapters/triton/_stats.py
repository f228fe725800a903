"""Statistics: Triton's cumulative counters turned into per-interval figures, and client timing.

Triton's statistics API (``/v2/models/NAME/stats``) reports counters that only grow since the
model was loaded: request counts and the nanoseconds spent queued, in compute (input, infer,
output), and compute time per executed batch size. ``interval_figures`` takes two snapshots
and returns what happened between them (rates, mean times per request and per batch size). A
counter that went down means the server restarted or the model was reloaded: the interval is
then measured from zero and flagged ``counters_reset``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ClientTiming", "cumulative_figures", "interval_figures"]

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _pair(stats: Mapping[str, Any], phase: str) -> tuple[int, int]:
    d = (stats.get("inference_stats") or {}).get(phase) or {}
    return int(d.get("count", 0) or 0), int(d.get("ns", 0) or 0)


def _batches(stats: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for b in stats.get("batch_stats") or []:
        infer = b.get("compute_infer") or {}
        out[int(b.get("batch_size", 0))] = (
            int(infer.get("count", 0) or 0),
            int(infer.get("ns", 0) or 0),
        )
    return out


def cumulative_figures(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The counters of one statistics snapshot as plain numbers."""
    out: dict[str, Any] = {
        "inference_count": int(stats.get("inference_count", 0) or 0),
        "execution_count": int(stats.get("execution_count", 0) or 0),
        "last_inference_ms": int(stats.get("last_inference", 0) or 0),
    }
    for phase in _PHASES:
        c, ns = _pair(stats, phase)
        out[f"{phase}_count"] = c
        out[f"{phase}_ns"] = ns
    out["batches"] = {
        b: {"count": c, "compute_infer_ns": ns} for b, (c, ns) in sorted(_batches(stats).items())
    }
    return out


def _mean_ms(ns: int, count: int) -> float | None:
    return ns / count / 1e6 if count > 0 else None


def interval_figures(
    prev: Mapping[str, Any] | None, cur: Mapping[str, Any], interval_s: float | None
) -> dict[str, Any]:
    """What happened between two statistics snapshots (``prev`` None: since the model loaded)."""
    c = cumulative_figures(cur)
    p = cumulative_figures(prev) if prev is not None else None
    reset = p is not None and (
        c["inference_count"] < p["inference_count"] or c["execution_count"] < p["execution_count"]
    )
    if p is None or reset:
        p = cumulative_figures({})

    def d(key: str) -> int:
        return int(c[key]) - int(p[key])

    requests = d("success_count")
    out: dict[str, Any] = {
        "interval_s": interval_s,
        "counters_reset": bool(reset),
        "requests": requests,
        "failed_requests": d("fail_count"),
        "inferences": d("inference_count"),
        "executions": d("execution_count"),
        "mean_batch_size": (d("inference_count") / d("execution_count"))
        if d("execution_count") > 0
        else None,
        "request_ms_mean": _mean_ms(d("success_ns"), requests),
        "queue_ms_mean": _mean_ms(d("queue_ns"), d("queue_count")),
        "compute_input_ms_mean": _mean_ms(d("compute_input_ns"), d("compute_input_count")),
        "compute_infer_ms_mean": _mean_ms(d("compute_infer_ns"), d("compute_infer_count")),
        "compute_output_ms_mean": _mean_ms(d("compute_output_ns"), d("compute_output_count")),
    }
    if interval_s and interval_s > 0:
        out["requests_per_s"] = requests / interval_s
        out["inferences_per_s"] = d("inference_count") / interval_s
    batches: dict[int, dict[str, Any]] = {}
    for b, cur_b in c["batches"].items():
        prev_b = p["batches"].get(b, {"count": 0, "compute_infer_ns": 0})
        n = cur_b["count"] - prev_b["count"]
        if n > 0:
            ns = cur_b["compute_infer_ns"] - prev_b["compute_infer_ns"]
            batches[b] = {"count": n, "compute_infer_ms_mean": ns / n / 1e6}
    out["batches"] = batches
    return out


@dataclass
class _Series:
    count: int = 0
    items: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=2048))


class ClientTiming:
    """Round-trip time of each batch request as the adapter saw it, by batch size."""

    def __init__(self) -> None:
        self._by_size: dict[int, _Series] = {}
        self.errors = 0
        self.item_errors = 0

    def record(self, batch_size: int, seconds: float) -> None:
        s = self._by_size.setdefault(int(batch_size), _Series())
        s.count += 1
        s.items += batch_size
        s.total_s += seconds
        s.max_s = max(s.max_s, seconds)
        s.recent.append(seconds)

    def summary(self) -> dict[str, Any]:
        batches: dict[int, dict[str, Any]] = {}
        for b, s in sorted(self._by_size.items()):
            rec = np.asarray(s.recent)
            batches[b] = {
                "count": s.count,
                "mean_ms": s.total_s / s.count * 1e3,
                "p50_ms": float(np.percentile(rec, 50)) * 1e3,
                "p99_ms": float(np.percentile(rec, 99)) * 1e3,
                "max_ms": s.max_s * 1e3,
            }
        return {
            "batches": batches,
            "requests": sum(s.count for s in self._by_size.values()),
            "items": sum(s.items for s in self._by_size.values()),
            "errors": self.errors,
            "item_errors": self.item_errors,
        }

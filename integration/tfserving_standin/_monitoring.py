"""STAND-IN monitoring: TF Serving's Prometheus page (``--monitoring_config_file`` with
``prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }``, on the REST
port) with TF Serving's metric names (its ``/tensorflow/serving/...`` names with ``/`` as
``:``, as the real exporter writes them):

* ``:tensorflow:serving:request_count{model_name, status}``: requests by outcome (``OK`` or
  the error code's name);
* ``:tensorflow:serving:request_latency{model_name, API, entrypoint}``: histogram of a
  request's whole time in the server, microseconds;
* ``:tensorflow:serving:runtime_latency{model_name, API, runtime}``: histogram, per request,
  of the run of its batch (microseconds);
* ``:tensorflow:serving:batching_session:queuing_latency{thread_pool_name}``: histogram of a
  request's wait in the batch queue (microseconds); the stand-in names each version's queue
  after its model;
* ``:tensorflow:serving:batching_session:wrapped_run_count``: batches run (server-wide, no
  labels, as the real counter).

STAND-IN ONLY: the batch log (``GET /standin/batches``): per batch run, its model, version,
requests, rows, padded rows, and its first request's queue entry, start and end (seconds on
the server's monotonic clock), so tests can check the batcher's decisions.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ._batching import BatchRecord

__all__ = ["Monitoring", "parse_monitoring_path"]

P = ":tensorflow:serving:"
# TF Serving's buckets: request latency Exponential(10, 1.8, 33), queuing Exponential(100, 1.2, 52)
_LATENCY = tuple(10 * 1.8**i for i in range(33))
_QUEUE = tuple(100 * 1.2**i for i in range(52))


def parse_monitoring_path(text: str) -> str | None:
    """The Prometheus path of a ``MonitoringConfig`` text (None: not enabled)."""
    from inferline.adapters.tfserving import parse_config_block

    msg = parse_config_block(text)
    for pc in msg.get("prometheus_config", []):
        if str(pc.get("enable", ["false"])[-1]).lower() in ("true", "1"):
            return str(pc.get("path", ["/monitoring/prometheus/metrics"])[-1])
    return None


class _Hist:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        i = next((k for k, b in enumerate(self.bounds) if v <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += v


def _labels(d: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = [f'{k}="{v}"' for k, v in d] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


class Monitoring:
    """The stand-in's counters and histograms (thread-safe) and its batch log."""

    def __init__(self, log_size: int = 20000) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._hists: dict[tuple[str, tuple[tuple[str, str], ...]], _Hist] = {}
        self.batches: deque[dict[str, Any]] = deque(maxlen=log_size)

    def count(self, name: str, labels: dict[str, str], by: float = 1.0) -> None:
        key = (P + name, tuple(labels.items()))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + by

    def observe(self, name: str, labels: dict[str, str], v: float, queue: bool = False) -> None:
        key = (P + name, tuple(labels.items()))
        with self._lock:
            h = self._hists.get(key)
            if h is None:
                h = self._hists[key] = _Hist(_QUEUE if queue else _LATENCY)
            h.observe(v)

    def request(self, model: str, status: str, seconds: float, entrypoint: str) -> None:
        self.count("request_count", {"model_name": model, "status": status})
        self.observe(
            "request_latency",
            {"model_name": model, "API": "predict", "entrypoint": entrypoint},
            seconds * 1e6,
        )

    def batch(self, model: str, version: int, r: BatchRecord) -> None:
        tasks, rows, padded, first, start, end = r
        self.count("batching_session:wrapped_run_count", {})
        for t in tasks:
            self.observe(
                "batching_session:queuing_latency",
                {"thread_pool_name": model},
                (start - t.entered) * 1e6,
                queue=True,
            )
            self.observe(
                "runtime_latency",
                {"model_name": model, "API": "Predict", "runtime": "TF1"},
                (end - start) * 1e6,
            )
        with self._lock:
            self.batches.append(
                {
                    "model": model,
                    "version": version,
                    "requests": len(tasks),
                    "rows": rows,
                    "padded": padded,
                    "first_entered": first,
                    "entered": [t.entered for t in tasks],
                    "start": start,
                    "end": end,
                }
            )

    def text(self) -> str:
        """The Prometheus text page."""
        out: list[str] = []
        with self._lock:
            for name in sorted({k[0] for k in self._counters}):
                out.append(f"# TYPE {name} counter")
                for (n, lab), v in self._counters.items():
                    if n == name:
                        out.append(f"{n}{_labels(lab)} {v:g}")
            for name in sorted({k[0] for k in self._hists}):
                out.append(f"# TYPE {name} histogram")
                for (n, lab), h in self._hists.items():
                    if n != name:
                        continue
                    acc = 0
                    for b, c in zip((*h.bounds, float("inf")), h.counts, strict=True):
                        acc += c
                        le = "+Inf" if b == float("inf") else f"{b:g}"
                        bound = f'le="{le}"'
                        out.append(f"{n}_bucket{_labels(lab, bound)} {acc}")
                    out.append(f"{n}_sum{_labels(lab)} {h.sum:.17g}")
                    out.append(f"{n}_count{_labels(lab)} {acc}")
        return "\n".join(out) + "\n"

    def batch_log(self, model: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [b for b in self.batches if model is None or b["model"] == model]

"""Triton's Prometheus metrics (``--metrics-port``, ``/metrics``) as cumulative counters per model.

The steer loop (``inferline attach --steer``) reads the server's own counters each tick: no
inferline process sits in the data path, so the server is the only witness of the traffic.
Per model (summed over versions, and over failure reasons):

* ``request_success`` / ``request_failure``: ``nv_inference_request_success`` / ``_failure``;
* ``inference_count`` / ``exec_count``: ``nv_inference_count`` / ``nv_inference_exec_count``
  (items and batches executed: their ratio is the mean batch size);
* ``queue_us``: ``nv_inference_queue_duration_us``;
* ``compute_us``: ``nv_inference_compute_{input,infer,output}_duration_us`` (a batch's whole
  service time, as the estimator's profiles count it);
* ``request_us``: ``nv_inference_request_duration_us``;
* ``request_p99_us`` (not cumulative, only where the server was started with
  ``--metrics-config summary_latencies=true``): the 0.99 quantile of
  ``nv_inference_request_summary_us``, over the summary's recent window.

Missing ones are omitted.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Mapping, Sequence

from inferline.core import BackendError

__all__ = ["COUNTERS", "fetch_metrics", "metrics_url_for", "parse_triton_metrics"]

COUNTERS = {
    "nv_inference_request_success": "request_success",
    "nv_inference_request_failure": "request_failure",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
    "nv_inference_compute_output_duration_us": "compute_us",
    "nv_inference_request_duration_us": "request_us",
}
_SUMMARY = "nv_inference_request_summary_us"
_P99 = "0.99"


def parse_triton_metrics(
    text: str, models: Sequence[str] | None = None
) -> dict[str, dict[str, float]]:
    """The counters of ``models`` (default: every model the text names) from the metrics
    page's text; a model the page does not name is absent from the answer."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = None if models is None else set(models)
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            model = s.labels.get("model")
            if model is None or (wanted is not None and model not in wanted):
                continue
            # the parser strips "_total" from counter families but the sample keeps the name
            name = s.name[:-6] if s.name.endswith("_total") else s.name
            key = COUNTERS.get(name)
            if key is not None:
                row = out.setdefault(model, {})
                row[key] = row.get(key, 0.0) + float(s.value)
            elif name == _SUMMARY and s.labels.get("quantile") == _P99:
                v = float(s.value)
                if v == v:  # a summary with no observation in its window reports NaN
                    row = out.setdefault(model, {})
                    row["request_p99_us"] = max(row.get("request_p99_us", 0.0), v)
    return out


def metrics_url_for(address: str, metrics_url: str | None) -> str:
    """The metrics page: ``metrics_url`` if given, else Triton's default port (8002) on the
    server's host."""
    if metrics_url:
        return metrics_url
    host = address.rsplit(":", 1)[0]
    return f"http://{host}:8002/metrics"


async def fetch_metrics(
    url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
) -> str:
    """The metrics page's text (``BackendError`` naming the URL when it cannot be read)."""

    def get() -> str:
        req = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return str(r.read().decode("utf-8", "replace"))

    try:
        return await asyncio.to_thread(get)
    except (OSError, ValueError) as e:
        raise BackendError(url, f"metrics not readable: {e}") from None

"""TF Serving's Prometheus page as cumulative counters per model.

TF Serving serves it on the REST port when started with ``--monitoring_config_file`` holding
``prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }``; its metric names
are its ``/tensorflow/serving/...`` names with ``/`` written ``:``. Per model (the
``model_name`` label), summed over versions, APIs and entry points:

* ``request_success`` / ``request_failure``: ``:tensorflow:serving:request_count`` with
  ``status="OK"`` / any other status;
* ``request_us``: the sum of ``:tensorflow:serving:request_latency`` (microseconds);
* ``compute_us``: the sum of ``:tensorflow:serving:runtime_latency`` (microseconds);
* ``queue_us``: the sum of ``:tensorflow:serving:batching_session:queuing_latency``, whose label
  is a batch thread pool's name, not a model's: counted for the model of that name, or, when
  ``models`` names one model, for that model unless the pool is named after another model;
* ``exec_count``: ``:tensorflow:serving:batching_session:wrapped_run_count`` (batches run),
  server-wide (no label): counted only when ``models`` names one model, one the page names.

TF Serving counts no predicted rows, so ``inference_count`` is never given. Missing ones are
omitted.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["METRICS_PATH", "parse_tfserving_metrics"]

METRICS_PATH = "/monitoring/prometheus/metrics"
_P = ":tensorflow:serving:"
_SUMS = {
    _P + "request_latency_sum": "request_us",
    _P + "runtime_latency_sum": "compute_us",
}
_QUEUE = _P + "batching_session:queuing_latency_sum"
_RUNS = _P + "batching_session:wrapped_run_count"
_REQUESTS = _P + "request_count"


def _add(out: dict[str, dict[str, float]], model: str, key: str, v: float) -> None:
    row = out.setdefault(model, {})
    row[key] = row.get(key, 0.0) + v


def parse_tfserving_metrics(text: str, models: Sequence[str]) -> dict[str, dict[str, float]]:
    """The counters of ``models`` (names on the server) from the page's text; a model the page
    does not name has an empty row."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(models)
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    named = {s.labels["model_name"] for s in samples if "model_name" in s.labels}
    # the one model asked for, if the page names it: server-wide counters are its own
    alone = next(iter(wanted)) if len(wanted) == 1 and wanted <= named else None
    out: dict[str, dict[str, float]] = {m: {} for m in models}
    for s in samples:
        # the parser strips "_total" from counter families but the sample keeps it
        name = s.name[:-6] if s.name.endswith("_total") else s.name
        model = s.labels.get("model_name")
        v = float(s.value)
        if name == _REQUESTS and model in wanted:
            ok = s.labels.get("status", "OK") == "OK"
            _add(out, model, "request_success" if ok else "request_failure", v)
        elif name in _SUMS and model in wanted:
            _add(out, model, _SUMS[name], v)
        elif name == _QUEUE:
            pool = s.labels.get("thread_pool_name")
            # a pool named after another model is that model's
            owner = pool if pool in wanted else (None if pool in named else alone)
            if owner is not None:
                _add(out, owner, "queue_us", v)
        elif name == _RUNS and alone is not None:
            _add(out, alone, "exec_count", v)
    return out

"""Prometheus metrics of a ``Service`` (prometheus-client, one private registry per service).

The frontend counts what it sees (requests by outcome, end-to-end latency); everything the
queue, cache and backend already count is read at scrape time by a collector, so the data
path pays nothing per query for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["LATENCY_BUCKETS_S", "PREDICTION_ERROR_BUCKETS_S", "Scraped", "ServiceMetrics"]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)

# admission's predicted minus actual completion: negative when a query finished later than
# predicted (the dangerous side), so the buckets are symmetric around 0
PREDICTION_ERROR_BUCKETS_S = (
    -0.05,
    -0.02,
    -0.01,
    -0.005,
    -0.002,
    -0.001,
    0.0,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
)


def _get(stats: Any, *names: str) -> Any:
    """The first of ``names`` present in a stats mapping or object, else None."""
    for n in names:
        if isinstance(stats, Mapping):
            if n in stats:
                return stats[n]
        elif hasattr(stats, n):
            return getattr(stats, n)
    return None


def _replica_labels(model: str, handle: Any, server: str = "") -> list[str]:
    """``[model, replica, node, server, hardware]`` of one replica handle; a handle without a
    node (every backend but ``ray://``) is on ``"local"``; one without a server (every backend
    but a fleet's) is on its backend's URL, ``server``."""
    labels = [model]
    for name, default in (("id", ""), ("node", "local"), ("server", server), ("hardware", "")):
        try:
            v = getattr(handle, name, default)
        except Exception:  # a handle's property must not fail the scrape
            v = default
        labels.append(str(v if v is not None else default))
    return labels


class Scraped(Protocol):
    """What the collector reads at scrape time (a ``Service``): its models and the parts
    that count for them, each optional."""

    models: list[str]
    dispatcher: Any
    backend: Any
    cache: Any


class _ScrapeCollector(Collector):
    def __init__(self, service: Scraped, door_overloads: Mapping[str, int]) -> None:
        self._service = service
        self._door_overloads = door_overloads

    def collect(self) -> Iterator[Metric]:
        svc = self._service
        qlen = GaugeMetricFamily(
            "inferline_queue_length", "Queries waiting in the model's queue", labels=["model"]
        )
        inflight = GaugeMetricFamily(
            "inferline_in_flight", "Queries in batches being processed", labels=["model"]
        )
        reps = GaugeMetricFamily(
            "inferline_replicas", "Active replicas of the model", labels=["model"]
        )
        overloads = CounterMetricFamily(
            "inferline_overloaded",
            "Queries refused because the queue was full, or a front door at its bound of calls "
            "in flight (the name the call asked for)",
            labels=["model"],
        )
        full: dict[str, float] = {}
        info = GaugeMetricFamily(
            "inferline_replica_info",
            "One series per active replica: where it runs (the Ray node id on ray://, 'local' "
            "on a backend without nodes; the server's URL, a fleet member's on a fleet) and on "
            "which hardware; always 1",
            labels=["model", "replica", "node", "server", "hardware"],
        )
        for m in svc.models:
            st = None
            if svc.dispatcher is not None:
                try:
                    st = svc.dispatcher.stats(m)
                except Exception:  # a scrape must never fail the endpoint
                    log.debug("no queue stats for %r", m, exc_info=True)
            if st is not None:
                v = _get(st, "queue_length", "queued", "qlen")
                if v is not None:
                    qlen.add_metric([m], float(v))
                v = _get(st, "in_flight", "inflight")
                if v is not None:
                    inflight.add_metric([m], float(v))
                v = _get(st, "overloaded", "rejected", "overloads")
                if v is not None:
                    full[m] = float(v)
            if svc.backend is not None:
                try:
                    handles = list(svc.backend.replicas(m))
                except Exception:
                    handles = []
                reps.add_metric([m], float(len(handles)))
                server = str(getattr(svc.backend, "url", "") or "")
                for h in handles:
                    info.add_metric(_replica_labels(m, h, server), 1.0)
        doors = dict(self._door_overloads)  # a copy: a scrape thread must not see it grow
        for m in {**full, **doors}:
            overloads.add_metric([m], full.get(m, 0.0) + doors.get(m, 0))
        yield qlen
        yield inflight
        yield reps
        yield overloads
        yield info
        cache = svc.cache
        if cache is not None:
            cst = cache.stats() if callable(getattr(cache, "stats", None)) else cache
            hits = _get(cst, "hits")
            misses = _get(cst, "misses")
            if hits is not None:
                yield CounterMetricFamily("inferline_cache_hits", "Cache hits", value=float(hits))
            if misses is not None:
                yield CounterMetricFamily(
                    "inferline_cache_misses", "Cache misses", value=float(misses)
                )


class ServiceMetrics:
    """Counters and histograms of one service, in a private registry."""

    def __init__(self, service: Scraped) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "inferline_requests",
            "Queries answered by the frontend, by outcome",
            ["app", "outcome"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "inferline_request_latency_seconds",
            "End-to-end latency of a query inside the server",
            ["app"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._defaults = Counter(
            "inferline_default_outputs",
            "Queries answered with the app's default output, by reason",
            ["app", "reason"],
            registry=self.registry,
        )
        self._batch_size = Histogram(
            "inferline_batch_size",
            "Sizes of the batches sent to replicas",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self._batch_latency = Histogram(
            "inferline_batch_latency_seconds",
            "Time a batch spent in its replica (send to reply, RPC included)",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._refused = Counter(
            "inferline_refused",
            "Queries refused by the queue, by reason (predicted_late: at arrival; dropped_late: "
            "when a batch was cut; queue_full: max_queue), answered with a refusal or a default",
            ["app", "reason"],
            registry=self.registry,
        )
        self._goodput = Counter(
            "inferline_goodput",
            "Predictions (not defaults) answered within the query's SLO",
            ["app"],
            registry=self.registry,
        )
        self._prediction_error = Histogram(
            "inferline_admission_prediction_error_seconds",
            "Admission's predicted minus actual completion of admitted queries",
            ["model"],
            buckets=PREDICTION_ERROR_BUCKETS_S,
            registry=self.registry,
        )
        self._late_calls = Counter(
            "inferline_late_calls",
            "Backend calls cut at their batch's deadline (the model answered too late, or "
            "would have): counted, their queries answered DeadlineExceeded, not awaited",
            ["model"],
            registry=self.registry,
        )
        self._late_items = Counter(
            "inferline_late_items",
            "Queries in backend calls cut at their batch's deadline",
            ["model"],
            registry=self.registry,
        )
        self._late_children: dict[str, tuple[Any, Any]] = {}
        self._goodput_children: dict[str, Any] = {}
        self._batch_children: dict[str, tuple[Any, Any]] = {}
        self._children: dict[tuple[str, str], Any] = {}
        self._lat_children: dict[str, Any] = {}
        self._door_overloads: dict[str, int] = {}
        self.registry.register(_ScrapeCollector(service, self._door_overloads))

    def observe(self, app: str, latency_s: float, outcome: str) -> None:
        key = (app, outcome)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = self._requests.labels(app, outcome)
        c.inc()
        h = self._lat_children.get(app)
        if h is None:
            h = self._lat_children[app] = self._latency.labels(app)
        h.observe(latency_s)

    def watch(self, dispatcher: Any) -> None:
        """Record every batch the dispatcher sends (a listener: one call per batch)."""
        from inferline.queueing import BatchEvent

        def on_event(ev: Any) -> None:
            if isinstance(ev, BatchEvent):
                ch = self._batch_children.get(ev.model)
                if ch is None:
                    ch = self._batch_children[ev.model] = (
                        self._batch_size.labels(ev.model),
                        self._batch_latency.labels(ev.model),
                    )
                ch[0].observe(ev.size)
                ch[1].observe(ev.service_s)
                if ev.late:  # cut at its deadline by the backend: counted, not awaited
                    lc = self._late_children.get(ev.model)
                    if lc is None:
                        lc = self._late_children[ev.model] = (
                            self._late_calls.labels(ev.model),
                            self._late_items.labels(ev.model),
                        )
                    lc[0].inc()
                    lc[1].inc(ev.size)
                if ev.prediction_errors_s:
                    h = self._prediction_error.labels(ev.model)
                    for err in ev.prediction_errors_s:
                        h.observe(err)

        dispatcher.add_listener(on_event)

    def defaults(self, app: str, reason: str) -> None:
        self._defaults.labels(app, reason).inc()

    def refused(self, app: str, reason: str) -> None:
        """A query the queue refused (``reason``: predicted_late, dropped_late, queue_full)."""
        self._refused.labels(app, reason).inc()

    def overloaded(self, name: str) -> None:
        """A call a front door refused at its bound of calls in flight, before any work
        (``name``: the model or app it asked for): ``inferline_overloaded_total{model=name}``,
        with the queue's own refusals of that name."""
        self._door_overloads[name] = self._door_overloads.get(name, 0) + 1

    def goodput(self, app: str) -> None:
        """A prediction answered within its SLO."""
        c = self._goodput_children.get(app)
        if c is None:
            c = self._goodput_children[app] = self._goodput.labels(app)
        c.inc()

    def rejected(self, app: str, outcome: str) -> None:
        """A request refused before reaching the app (bad input, unknown app)."""
        key = (app, outcome)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = self._requests.labels(app, outcome)
        c.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

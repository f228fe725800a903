"""Pipeline DAG (format ``inferline.pipeline/1``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ._validate import as_float, as_list, as_mapping, as_str, check_format, no_extra_keys, req
from .errors import NotFoundError, ValidationError

__all__ = ["PIPELINE_FORMAT", "Pipeline"]

PIPELINE_FORMAT = "inferline.pipeline/1"
MAX_VISITS = 255.0  # calls of one model per query (the estimator counts them in a byte)


@dataclass(frozen=True)
class Pipeline:
    """A DAG of models. Queries enter every model without a parent.

    ``scale_factors[m]`` (default 1.0) is the probability that a query entering the pipeline
    visits ``m``; a query visits ``m`` only if it visited at least one of its parents.
    ``visits[m]`` (default 1.0, at least 1) is the mean number of calls a query that visits
    ``m`` makes to it: the calls are sequential, each one a queue entry of its own that enters
    ``m``'s queue when the previous one finishes, and ``m``'s children start after the last.
    A fractional part is the probability of one call more (``floor(v)`` or ``floor(v) + 1``
    calls). A pipeline query thus makes ``scale_factors[m] * visits[m]`` calls to ``m`` on
    average (:meth:`calls`), the load factor planning multiplies rates by.
    """

    name: str
    models: tuple[str, ...]
    edges: tuple[tuple[str, str], ...] = ()
    scale_factors: Mapping[str, float] = field(default_factory=dict)
    visits: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_str(self.name, "name")
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "edges", tuple((a, b) for a, b in self.edges))
        if not self.models:
            raise ValidationError("models", "at least one model name", [])
        seen: set[str] = set()
        for m in self.models:
            as_str(m, "models[]")
            if m in seen:
                raise ValidationError("models", "unique model names", m)
            seen.add(m)
        for i, (a, b) in enumerate(self.edges):
            for end in (a, b):
                if end not in seen:
                    raise ValidationError(
                        f"edges[{i}]", f"model names from {list(self.models)!r}", end
                    )
            if a == b:
                raise ValidationError(f"edges[{i}]", "an edge between two different models", [a, b])
        if len(set(self.edges)) != len(self.edges):
            raise ValidationError("edges", "no duplicate edges", list(self.edges))
        for m, s in self.scale_factors.items():
            if m not in seen:
                raise ValidationError("scale_factors", f"keys from {list(self.models)!r}", m)
            as_float(s, f"scale_factors.{m}", lo=0.0, hi=1.0)
            if s <= 0:
                raise ValidationError(f"scale_factors.{m}", "a probability in (0, 1]", s)
        for m, v in self.visits.items():
            if m not in seen:
                raise ValidationError("visits", f"keys from {list(self.models)!r}", m)
            as_float(v, f"visits.{m}", lo=1.0, hi=MAX_VISITS)
        self.topological_order  # raises on cycles  # noqa: B018

    # -- structure -----------------------------------------------------------------------
    @cached_property
    def parents(self) -> dict[str, tuple[str, ...]]:
        p: dict[str, list[str]] = {m: [] for m in self.models}
        for a, b in self.edges:
            p[b].append(a)
        return {m: tuple(v) for m, v in p.items()}

    @cached_property
    def children(self) -> dict[str, tuple[str, ...]]:
        c: dict[str, list[str]] = {m: [] for m in self.models}
        for a, b in self.edges:
            c[a].append(b)
        return {m: tuple(v) for m, v in c.items()}

    @cached_property
    def roots(self) -> tuple[str, ...]:
        return tuple(m for m in self.models if not self.parents[m])

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Kahn's algorithm, ties broken by declaration order (so the order is deterministic)."""
        indeg = {m: len(self.parents[m]) for m in self.models}
        order: list[str] = []
        ready = [m for m in self.models if indeg[m] == 0]
        index = {m: i for i, m in enumerate(self.models)}
        while ready:
            ready.sort(key=index.__getitem__)
            m = ready.pop(0)
            order.append(m)
            for c in self.children[m]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        if len(order) != len(self.models):
            cyc = [m for m in self.models if m not in order]
            raise ValidationError("edges", "an acyclic graph", f"cycle through {cyc!r}")
        return tuple(order)

    def scale_factor(self, model: str) -> float:
        if model not in self.parents:
            raise NotFoundError("model", model, list(self.models))
        return float(self.scale_factors.get(model, 1.0))

    def visits_of(self, model: str) -> float:
        """Mean calls to ``model`` by a query that visits it (1.0 unless ``visits`` says)."""
        if model not in self.parents:
            raise NotFoundError("model", model, list(self.models))
        return float(self.visits.get(model, 1.0))

    def calls(self, model: str) -> float:
        """Mean calls to ``model`` per pipeline query: ``scale_factor * visits``, the factor
        between the pipeline's arrival rate and the rate of queue entries at the model."""
        return self.scale_factor(model) * self.visits_of(model)

    def visit_probability(self, model: str) -> float:
        """Probability that a query visiting at least one parent of ``model`` also visits it.

        Exact when the model has one parent; with several parents the most likely parent is
        used (exact when their visits are nested, e.g. a join whose scale factor is 1).
        """
        ps = self.parents[model]
        s = self.scale_factor(model)
        if not ps:
            return s
        base = max(self.scale_factor(p) for p in ps)
        return min(1.0, s / base)

    def critical_path(self, cost: Mapping[str, float]) -> tuple[float, tuple[str, ...]]:
        """Longest path by per-model ``cost`` (e.g. batch latency); returns (length, models)."""
        best: dict[str, tuple[float, tuple[str, ...]]] = {}
        for m in self.topological_order:
            prev = max((best[p] for p in self.parents[m]), default=(0.0, ()), key=lambda t: t[0])
            best[m] = (prev[0] + float(cost[m]), (*prev[1], m))
        return max(best.values(), key=lambda t: t[0])

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": PIPELINE_FORMAT,
            "name": self.name,
            "models": list(self.models),
            "edges": [[a, b] for a, b in self.edges],
        }
        if self.scale_factors:
            d["scale_factors"] = dict(self.scale_factors)
        if self.visits:
            d["visits"] = dict(self.visits)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Pipeline:
        m = check_format(d, PIPELINE_FORMAT)
        no_extra_keys(m, {"format", "name", "models", "edges", "scale_factors", "visits"}, "")
        models = tuple(as_str(x, "models[]") for x in as_list(req(m, "models", ""), "models"))
        edges = []
        for i, e in enumerate(as_list(m.get("edges", []), "edges")):
            e = as_list(e, f"edges[{i}]")
            if len(e) != 2:
                raise ValidationError(f"edges[{i}]", "a pair [parent, child]", e)
            edges.append((as_str(e[0], f"edges[{i}][0]"), as_str(e[1], f"edges[{i}][1]")))
        sf = {
            as_str(k, "scale_factors"): as_float(v, f"scale_factors.{k}", lo=0.0, hi=1.0)
            for k, v in as_mapping(m.get("scale_factors", {}), "scale_factors").items()
        }
        vs = {
            as_str(k, "visits"): as_float(v, f"visits.{k}", lo=1.0, hi=MAX_VISITS)
            for k, v in as_mapping(m.get("visits", {}), "visits").items()
        }
        return cls(as_str(req(m, "name", ""), "name"), models, tuple(edges), sf, vs)

    @classmethod
    def linear(cls, name: str, models: list[str] | tuple[str, ...]) -> Pipeline:
        return cls(name, tuple(models), tuple(itertools.pairwise(models)))

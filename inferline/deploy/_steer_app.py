"""What ``inferline attach --steer --app NAME`` steers: a Triton ensemble's steps as a pipeline,
or one model.

An ensemble's own configuration says its pipeline: each step of ``ensemble_scheduling`` is a
composing model, and a step whose ``input_map`` reads a tensor another step's ``output_map``
writes runs after it (an edge). Every composing model is planned. Pure: configurations in,
a :class:`Pipeline` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferline.core import Pipeline, ValidationError

__all__ = ["ensemble_pipeline", "is_ensemble", "single_model_pipeline"]


def is_ensemble(config: Mapping[str, Any]) -> bool:
    return config.get("platform") == "ensemble" or "ensemble_scheduling" in config


def ensemble_pipeline(name: str, config: Mapping[str, Any]) -> Pipeline:
    """The pipeline of the ensemble ``name`` (its configuration as the server reports it):
    its steps' models in an order that respects their data flow, and an edge wherever one
    step reads what another writes."""
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    if not steps:
        raise ValidationError(f"{name}.ensemble_scheduling.step", "at least one step", steps)
    writes: dict[str, str] = {}  # tensor -> the model writing it
    models: list[str] = []
    for i, st in enumerate(steps):
        m = st.get("model_name")
        if not isinstance(m, str) or not m:
            raise ValidationError(f"{name}.ensemble_scheduling.step[{i}].model_name", "a name", m)
        if m in models:
            # a model called twice in one ensemble is two visits of one queue: not a DAG node
            raise ValidationError(
                f"{name}.ensemble_scheduling.step[{i}].model_name",
                "each composing model once (give --pipeline for anything else)",
                m,
            )
        models.append(m)
        for tensor in (st.get("output_map") or {}).values():
            writes[str(tensor)] = m
    edges: list[tuple[str, str]] = []
    for st in steps:
        for tensor in (st.get("input_map") or {}).values():
            src = writes.get(str(tensor))
            if src is not None and src != st["model_name"]:
                edge = (src, st["model_name"])
                if edge not in edges:
                    edges.append(edge)
    return Pipeline(name, tuple(_topological(models, edges)), tuple(edges))


def _topological(models: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """``models`` in an order where every edge goes forward (steps' own order kept where it
    already does)."""
    parents = {m: {a for a, b in edges if b == m} for m in models}
    out: list[str] = []
    while len(out) < len(models):
        ready = [m for m in models if m not in out and parents[m] <= set(out)]
        if not ready:
            raise ValidationError("ensemble_scheduling.step", "a data flow without cycles", edges)
        out.append(ready[0])
    return out


def single_model_pipeline(model: str) -> Pipeline:
    return Pipeline(model, (model,))

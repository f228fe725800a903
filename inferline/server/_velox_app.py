"""Velox inside ``inferline serve``: the deployment's ``velox`` block, wired to the service.

::

    "velox": {"store": "velox.sqlite",            # SQLite path (default: throwaway), or redis://...
              "models": [
                {"name": "songs", "dim": 16,
                 "features": {"model": "song-embedder", "output": "embedding", "timeout_ms": 200,
                              "input": {"dtype": "float32", "shape": [8]}},
                 "config": {"alpha": 1.0, "ridge_lambda": 1.0}},
                {"name": "movies",
                 "features": {"table": "item_factors.npz", "unknown": "mean"}}]}  # materialized

A split model's features come from a model of the deployment (``output`` picks a field when the
model answers with an object; ``input``, optional, is the form an item ``x`` must have, checked
before the call so that a wrong one is a 422 naming ``x`` rather than the feature model's
failure, a 502), called through the service's interposed queue (so Velox feature calls are batched, EDF-ordered and scaled like any other
query); a table model reads ``ids`` and ``matrix`` arrays from an ``.npz`` file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core import ValidationError
from inferline.core._validate import (
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    no_extra_keys,
    req,
)

__all__ = ["VeloxModelSpec", "VeloxSpec", "start_velox"]


@dataclass(frozen=True)
class VeloxModelSpec:
    name: str
    features: Mapping[str, Any]
    dim: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "features": dict(self.features)}
        if self.dim is not None:
            d["dim"] = self.dim
        if self.config:
            d["config"] = dict(self.config)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> VeloxModelSpec:
        m = as_mapping(d, where)
        no_extra_keys(m, {"name", "features", "dim", "config"}, where)
        feats = as_mapping(req(m, "features", where), f"{where}.features")
        if ("model" in feats) == ("table" in feats):
            raise ValidationError(
                f"{where}.features", "exactly one of 'model' or 'table'", sorted(feats)
            )
        if "model" in feats:
            no_extra_keys(feats, {"model", "output", "timeout_ms", "input"}, f"{where}.features")
            as_str(feats["model"], f"{where}.features.model")
            if "input" in feats:
                from inferline.server._service import InputSpec

                InputSpec.from_dict(feats["input"], f"{where}.features.input")
            if "timeout_ms" in feats:
                as_float(feats["timeout_ms"], f"{where}.features.timeout_ms", positive=True)
            if "dim" not in m:
                raise ValidationError(
                    f"{where}.dim", "the feature dimension of a split model", None
                )
        else:
            no_extra_keys(feats, {"table", "unknown"}, f"{where}.features")
            as_str(feats["table"], f"{where}.features.table")
        dim = as_int(m["dim"], f"{where}.dim", minimum=1) if "dim" in m else None
        from inferline.velox import VeloxConfig

        config = dict(as_mapping(m.get("config", {}), f"{where}.config"))
        try:
            VeloxConfig.from_dict(config)
        except (TypeError, ValueError) as e:
            raise ValidationError(f"{where}.config", "VeloxConfig fields", str(e)) from None
        return cls(as_str(req(m, "name", where), f"{where}.name"), dict(feats), dim, config)


@dataclass(frozen=True)
class VeloxSpec:
    models: tuple[VeloxModelSpec, ...]
    store: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"models": [m.to_dict() for m in self.models]}
        if self.store is not None:
            d["store"] = self.store
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "velox") -> VeloxSpec:
        m = as_mapping(d, where)
        no_extra_keys(m, {"models", "store"}, where)
        models = tuple(
            VeloxModelSpec.from_dict(x, f"{where}.models[{i}]")
            for i, x in enumerate(as_list(req(m, "models", where), f"{where}.models"))
        )
        if not models:
            raise ValidationError(f"{where}.models", "at least one Velox model", [])
        store = as_str(m["store"], f"{where}.store") if "store" in m else None
        return cls(models, store)


def _split_features(
    service: Any, model: str, timeout_s: float, output: str | None, spec: Any = None
) -> Callable[[Any], Any]:
    import asyncio

    if service.dispatcher is None or model not in service.models:
        raise ValidationError(
            "velox.features.model", f"a model of the deployment {service.models!r}", model
        )

    async def features(x: Any) -> np.ndarray:
        if spec is not None:
            x = spec.check(x, "x")
        loop = asyncio.get_running_loop()
        out = await service.dispatcher.submit(model, x, deadline=loop.time() + timeout_s)
        if output is not None:
            if not isinstance(out, Mapping) or output not in out:
                raise ValidationError(
                    f"velox features of {model!r}",
                    f"an object with the field {output!r}",
                    type(out).__name__,
                )
            out = out[output]
        return np.asarray(out, dtype=np.float64).reshape(-1)

    return features


async def start_velox(service: Any, spec: VeloxSpec) -> Callable[[Any], Any]:
    """Create the Velox service for ``spec`` on top of ``service``; returns the router factory
    to mount. The Velox service closes with ``service``."""
    from inferline.velox import (
        FeatureTable,
        RedisStore,
        SplitModel,
        SQLiteStore,
        TableModel,
        VeloxConfig,
        VeloxService,
        make_velox_router,
    )

    store = None
    if spec.store is not None:
        store = (
            RedisStore(spec.store)
            if spec.store.startswith(("redis://", "rediss://"))
            else SQLiteStore(spec.store)
        )
    vs = VeloxService(store)
    for m in spec.models:
        cfg = VeloxConfig.from_dict(dict(m.config)) if m.config else None
        if "model" in m.features:
            timeout = float(m.features.get("timeout_ms", 1000.0)) / 1e3
            assert m.dim is not None  # validated in from_dict
            spec_in = None
            if "input" in m.features:
                from inferline.server._service import InputSpec

                spec_in = InputSpec.from_dict(m.features["input"])
            fn = _split_features(
                service, m.features["model"], timeout, m.features.get("output"), spec_in
            )
            vm: Any = SplitModel(m.name, m.dim, fn)
        else:
            try:
                with np.load(m.features["table"], allow_pickle=False) as z:
                    table = FeatureTable(
                        list(z["ids"].tolist()), z["matrix"], m.features.get("unknown", "error")
                    )
            except (OSError, KeyError, ValueError) as e:
                raise ValidationError(
                    f"velox.models.{m.name}.features.table",
                    "an .npz file with 'ids' and 'matrix'",
                    str(e),
                ) from None
            vm = TableModel(m.name, table)
        await vs.register(vm, cfg)
    service.on_close(vs.close)
    return lambda _service: make_velox_router(vs)

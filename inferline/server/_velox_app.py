"""Velox inside ``inferline serve``: the deployment's ``velox`` block, wired to the service.

::

    "velox": {"store": "velox.sqlite",            # SQLite path (default: throwaway), or redis://...
              "models": [
                {"name": "songs", "dim": 16,
                 "features": {"model": "song-embedder", "output": "embedding", "timeout_ms": 200,
                              "input": {"dtype": "float32", "shape": [8]}},
                 "config": {"alpha": 1.0, "ridge_lambda": 1.0}},
                {"name": "movies",
                 "features": {"table": "item_factors.npz", "unknown": "mean"},  # materialized
                 "training_data": {"sqlite": "ratings.db", "table": "ratings"},  # or {"file": "r.csv"}
                 "starting_weights": {"users": "user_weights.npz"}}]}  # and/or "fit": true

A split model's features come from a model of the deployment (``output`` picks a field when the
model answers with an object; ``input``, optional, is the form an item ``x`` must have, checked
before the call so that a wrong one is a 422 naming ``x`` rather than the feature model's
failure, a 502), called through the service's interposed queue (so Velox feature calls are batched, EDF-ordered and scaled like any other
query); a table model reads ``ids`` and ``matrix`` arrays from an ``.npz`` file.

``training_data`` (a CSV file or a SQLite table of ``uid,item,rating[,ts]``) is what version 1
was trained on: every retrain uses it together with everything observed since.
``starting_weights`` gives version 1's per-user weights (``users``: an ``.npz`` of ``ids`` and
``matrix``) and/or fits version 1 on the training data at first start (``fit``). A split
model's features are versioned by the feature model's deployed version (its spec's
``version``, source and params): a redeployed model gets fresh feature-cache keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core import (
    ValidationError,
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
    training_data: Any = None  # TrainingData
    starting_weights: Any = None  # StartingWeights

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "features": dict(self.features)}
        if self.dim is not None:
            d["dim"] = self.dim
        if self.config:
            d["config"] = dict(self.config)
        if self.training_data is not None:
            d["training_data"] = self.training_data.to_dict()
        if self.starting_weights is not None:
            d["starting_weights"] = self.starting_weights.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> VeloxModelSpec:
        m = as_mapping(d, where)
        no_extra_keys(
            m, {"name", "features", "dim", "config", "training_data", "starting_weights"}, where
        )
        feats = as_mapping(req(m, "features", where), f"{where}.features")
        if ("model" in feats) == ("table" in feats):
            raise ValidationError(
                f"{where}.features", "exactly one of 'model' or 'table'", sorted(feats)
            )
        if "model" in feats:
            no_extra_keys(feats, {"model", "output", "timeout_ms", "input"}, f"{where}.features")
            as_str(feats["model"], f"{where}.features.model")
            if "input" in feats:
                from inferline.server._decode import InputSpec

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
        from inferline.velox import StartingWeights, TrainingData, VeloxConfig

        config = dict(as_mapping(m.get("config", {}), f"{where}.config"))
        try:
            VeloxConfig.from_dict(config)
        except (TypeError, ValueError) as e:
            raise ValidationError(f"{where}.config", "VeloxConfig fields", str(e)) from None
        training = _sub(m, "training_data", TrainingData, where)
        start = _sub(m, "starting_weights", StartingWeights, where)
        if start is not None and start.fit and training is None:
            raise ValidationError(
                f"{where}.starting_weights.fit", "training_data to fit on", "no training_data"
            )
        name = as_str(req(m, "name", where), f"{where}.name")
        return cls(name, dict(feats), dim, config, training, start)


def _sub(m: Mapping[str, Any], key: str, cls: Any, where: str) -> Any:
    """``cls.from_dict(m[key])`` with the error's field prefixed by where it is."""
    if key not in m:
        return None
    try:
        return cls.from_dict(m[key])
    except ValidationError as e:
        raise ValidationError(f"{where}.{e.field}", e.expected, e.got) from None
    except TypeError as e:
        raise ValidationError(f"{where}.{key}", f"{cls.__name__} fields", str(e)) from None


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


def _deployed_version(service: Any, model: str, memo: dict[str, tuple[Any, str]]) -> str | None:
    """The feature model's deployed version: its spec's ``version`` plus a digest of its source
    and params, so a redeploy with new weights under the same version number counts too.
    Read from the backend's record of deployed specs (the bundled and Ray backends keep one);
    None when the backend does not expose it."""
    import hashlib
    import json

    rec = getattr(getattr(service, "backend", None), "_models", {}).get(model)
    spec = getattr(rec, "spec", None)
    if spec is None:
        return None
    hit = memo.get(model)
    if hit is not None and hit[0] is spec:  # called per feature lookup: digest once per deploy
        return hit[1]
    what = json.dumps([spec.source, dict(spec.params)], sort_keys=True, default=str)
    token = f"{spec.version}-{hashlib.sha1(what.encode()).hexdigest()[:10]}"
    memo[model] = (spec, token)
    return token


def _table_model(m: VeloxModelSpec) -> Any:
    from inferline.velox import FeatureTable, TableModel

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
    return TableModel(m.name, table)


def _split_model(service: Any, m: VeloxModelSpec) -> Any:
    from inferline.velox import SplitModel

    timeout = float(m.features.get("timeout_ms", 1000.0)) / 1e3
    assert m.dim is not None  # validated in from_dict
    spec_in = None
    if "input" in m.features:
        from inferline.server._decode import InputSpec

        spec_in = InputSpec.from_dict(m.features["input"])
    feature_model = m.features["model"]
    fn = _split_features(service, feature_model, timeout, m.features.get("output"), spec_in)
    memo: dict[str, tuple[Any, str]] = {}  # the deployed spec and its version token
    return SplitModel(
        m.name, m.dim, fn, version=lambda: _deployed_version(service, feature_model, memo)
    )


def _bootstrap(m: VeloxModelSpec, dim: int) -> Any:
    from inferline.velox import Bootstrap, load_training_data, load_user_weights

    def named(e: ValidationError) -> ValidationError:
        return ValidationError(f"velox.models.{m.name}.{e.field}", e.expected, e.got)

    try:
        training = () if m.training_data is None else tuple(load_training_data(m.training_data))
        start = m.starting_weights
        users = {} if start is None or start.users is None else load_user_weights(start.users, dim)
        return Bootstrap(training, users, bool(start is not None and start.fit))
    except ValidationError as e:
        raise named(e) from None


async def start_velox(service: Any, spec: VeloxSpec) -> Callable[[Any], Any]:
    """Create the Velox service for ``spec`` on top of ``service``; returns the router factory
    to mount. The Velox service closes with ``service``."""
    from inferline.velox import (
        RedisStore,
        SQLiteStore,
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
        vm = _split_model(service, m) if "model" in m.features else _table_model(m)
        await vs.register(vm, cfg, bootstrap=_bootstrap(m, vm.dim))
    service.on_close(vs.close)
    return lambda _service: make_velox_router(vs)

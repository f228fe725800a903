"""STAND-IN model format and model manager (not TensorFlow Serving).

No ``tensorflow_model_server`` binary installs from the package registries, so the integration
tests run, when none is present, against this stand-in. It keeps TF Serving's semantics:
versioned model directories under ``base_path``, a model set replaced whole by each reload,
version states ``START -> LOADING -> AVAILABLE -> UNLOADING -> END``, ``NOT_FOUND`` for a
model with no available version. Its model format is its own (a real server loads
SavedModels): ``base_path/<version>/model.npz`` with dense layers ``W0, b0, W1, b1, ...``
(ReLU between them, softmax at the end) and ``signature.json``::

    {"inputs": {"x": {"dtype": "DT_FLOAT", "shape": [-1, 64]}},
     "outputs": {"probabilities": {"dtype": "DT_FLOAT", "shape": [-1, 10]},
                 "classes": {"dtype": "DT_INT64", "shape": [-1]}}}
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Loaded", "ModelManager", "ServingError", "save_dense_model"]

DT = {"DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_INT32": np.int32, "DT_INT64": np.int64}


class ServingError(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


def save_dense_model(
    base_path: Path, version: int, layers: list[tuple[np.ndarray, np.ndarray]]
) -> Path:
    """Write a dense classifier (weights, biases per layer) in the stand-in's format."""
    d = Path(base_path) / str(version)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, (w, b) in enumerate(layers):
        arrays[f"W{i}"] = np.asarray(w, dtype=np.float32)
        arrays[f"b{i}"] = np.asarray(b, dtype=np.float32)
    np.savez(d / "model.npz", **arrays)
    n_in = layers[0][0].shape[0]
    n_out = layers[-1][0].shape[1]
    sig = {
        "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [-1, n_in]}},
        "outputs": {
            "probabilities": {"dtype": "DT_FLOAT", "shape": [-1, n_out]},
            "classes": {"dtype": "DT_INT64", "shape": [-1]},
        },
    }
    (d / "signature.json").write_text(json.dumps(sig))
    return d


@dataclass
class Loaded:
    name: str
    version: int
    layers: list[tuple[np.ndarray, np.ndarray]]
    signature: dict[str, Any]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        want = self.signature["inputs"]
        if set(inputs) != set(want):
            raise ServingError(
                "INVALID_ARGUMENT", f"expected inputs {sorted(want)}, got {sorted(inputs)}"
            )
        (name,) = want
        x = inputs[name]
        shape = want[name]["shape"]
        if x.ndim != len(shape) or any(
            s >= 0 and s != g for s, g in zip(shape, x.shape, strict=False)
        ):
            raise ServingError(
                "INVALID_ARGUMENT", f"input {name!r} must have shape {shape}, got {list(x.shape)}"
            )
        try:
            h = x.astype(np.float32)
        except (TypeError, ValueError) as e:
            raise ServingError("INVALID_ARGUMENT", f"input {name!r}: {e}") from None
        if not np.all(np.isfinite(h)):
            raise ServingError("INVALID_ARGUMENT", f"input {name!r} holds NaN or inf")
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        e = np.exp(h - h.max(axis=1, keepdims=True))
        p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return {"probabilities": p, "classes": p.argmax(axis=1).astype(np.int64)}


@dataclass
class _Entry:
    base_path: str
    versions: tuple[int, ...] | None
    states: dict[int, tuple[str, str, str]] = field(
        default_factory=dict
    )  # version -> state, code, msg
    loaded: dict[int, Loaded] = field(default_factory=dict)


class ModelManager:
    """The stand-in's model set. Thread-safe: the REST and gRPC servers share it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, _Entry] = {}
        self._gone: dict[str, dict[int, tuple[str, str, str]]] = {}

    def _load(self, name: str, base_path: str, versions: tuple[int, ...] | None) -> _Entry:
        e = _Entry(base_path, versions)
        root = Path(base_path)
        if not root.is_dir():
            raise ServingError(
                "NOT_FOUND", f"Could not find base path {base_path} for servable {name}"
            )
        found = sorted(
            int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "model.npz").exists()
        )
        chosen = [v for v in found if v in versions] if versions is not None else found[-1:]
        if not chosen:
            raise ServingError(
                "NOT_FOUND", f"No versions of servable {name} found under base path {base_path}"
            )
        for v in chosen:
            e.states[v] = ("LOADING", "OK", "")
            d = root / str(v)
            z = np.load(d / "model.npz")
            n = len([k for k in z.files if k.startswith("W")])
            layers = [(z[f"W{i}"], z[f"b{i}"]) for i in range(n)]
            e.loaded[v] = Loaded(name, v, layers, json.loads((d / "signature.json").read_text()))
            e.states[v] = ("AVAILABLE", "OK", "")
        return e

    def reload(self, config: list[dict[str, Any]]) -> None:
        """Make the model set exactly ``config`` (dicts: name, base_path, versions)."""
        with self._lock:
            new: dict[str, _Entry] = {}
            errors = []
            for c in config:
                name = c["name"]
                old = self._models.get(name)
                if (
                    old is not None
                    and old.base_path == c["base_path"]
                    and old.versions == c.get("versions")
                ):
                    new[name] = old  # unchanged: stays loaded
                    continue
                try:
                    new[name] = self._load(name, c["base_path"], c.get("versions"))
                except ServingError as err:
                    errors.append(err)
                    self._gone[name] = {0: ("END", err.code, err.message)}
            for name, e in self._models.items():
                if name not in new:  # replaced set: everything not listed is unloaded
                    self._gone[name] = {v: ("END", "OK", "") for v in e.states}
            self._models = new
            for name in new:
                self._gone.pop(name, None)
            if errors:
                raise errors[0]

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str, str, str]]:
        with self._lock:
            e = self._models.get(name)
            states = dict(e.states) if e is not None else dict(self._gone.get(name, {}))
        if not states:
            raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
        if version is not None:
            if version not in states:
                raise ServingError("NOT_FOUND", f"Could not find version {version} of model {name}")
            states = {version: states[version]}
        return [(v, *states[v]) for v in sorted(states)]

    def get(self, name: str, version: int | None = None) -> Loaded:
        with self._lock:
            e = self._models.get(name)
            loaded = dict(e.loaded) if e is not None else {}
        if not loaded:
            raise ServingError("NOT_FOUND", f"Servable not found for request: Latest({name})")
        if version is None:
            return loaded[max(loaded)]
        if version not in loaded:
            raise ServingError(
                "NOT_FOUND", f"Servable not found for request: Specific({name}, {version})"
            )
        return loaded[version]

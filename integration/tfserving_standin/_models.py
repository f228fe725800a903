"""STAND-IN model format and model manager (not TensorFlow Serving).

No ``tensorflow_model_server`` binary installs from the package registries, so the integration
tests run, when none is present, against this stand-in. It keeps TF Serving's semantics:
versioned model directories under ``base_path`` served by each model's version policy
(``latest {num_versions}``, ``all``, ``specific``), version labels that may only name an
AVAILABLE version and resolve requests by label, a model set replaced whole by each reload,
version states ``START -> LOADING -> AVAILABLE -> UNLOADING -> END``, ``NOT_FOUND`` for a
model with no available version. Its model format is its own (a real server loads
SavedModels): ``base_path/<version>/model.npz`` with dense layers ``W0, b0, W1, b1, ...``
(ReLU between them, softmax at the end) and ``signature.json``::

    {"inputs": {"x": {"dtype": "DT_FLOAT", "shape": [-1, 64]}},
     "outputs": {"probabilities": {"dtype": "DT_FLOAT", "shape": [-1, 10]},
                 "classes": {"dtype": "DT_INT64", "shape": [-1]}}}

STAND-IN ONLY, for tests that need a model whose batches take time: ``cost.json`` in a version
directory, ``{"base_ms": 20, "per_row_ms": 1}``, makes every run of that version sleep that long
(rows counted after padding, as a real model pays for the padded batch).

Batching as the real server's (``_batching``): with ``--enable_batching`` every version runs
its requests through a batch scheduler; with ``--enable_per_model_batching_parameters`` a
version directory's ``batching_params.pbtxt`` (at the SavedModel root) sets its parameters,
read when that version loads (a version already loaded keeps its parameters through any config
reload: TF Serving #2008), else the ``--batching_parameters_file``'s (or TF Serving's defaults).
A reload keeps the versions still chosen and loaded as they are, loads new ones and unloads
the others after their queued requests ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferline.adapters.tfserving import BATCHING_PARAMS, ServedModel, parse_batching_text
from inferline.core import ValidationError

from ._batching import Batcher, BatchingParams, BatchRecord, Refused

__all__ = ["BatchingConfig", "Loaded", "ModelManager", "ServingError", "save_dense_model"]

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


@dataclass(frozen=True)
class BatchingConfig:
    """The server's batching flags: ``--enable_batching``,
    ``--enable_per_model_batching_parameters`` and the ``--batching_parameters_file``'s
    parameters (the defaults of versions without their own)."""

    enabled: bool = False
    per_model: bool = False
    defaults: BatchingParams = field(default_factory=BatchingParams)


@dataclass
class Loaded:
    name: str
    version: int
    layers: list[tuple[np.ndarray, np.ndarray]]
    signature: dict[str, Any]
    cost_s: tuple[float, float] = (0.0, 0.0)  # STAND-IN ONLY (cost.json): per run, per row
    batcher: Batcher | None = None

    def check(self, inputs: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
        """The one input, checked against the signature, as float32."""
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
        return name, h

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the model on a (batched) input."""
        (h,) = inputs.values()
        if self.cost_s != (0.0, 0.0):
            time.sleep(self.cost_s[0] + self.cost_s[1] * h.shape[0])
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        e = np.exp(h - h.max(axis=1, keepdims=True))
        p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return {"probabilities": p, "classes": p.argmax(axis=1).astype(np.int64)}

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Serve one request: through the version's batcher when batching is on."""
        name, h = self.check(inputs)
        if self.batcher is None:
            return self.compute({name: h})
        try:
            return self.batcher.submit({name: h})
        except Refused as e:
            raise ServingError("UNAVAILABLE", str(e)) from None
        except ValueError as e:
            raise ServingError("INVALID_ARGUMENT", str(e)) from None


@dataclass
class _Entry:
    base_path: str
    policy: tuple[str, Any]  # ServedModel.policy: which versions under base_path are served
    states: dict[int, tuple[str, str, str]] = field(
        default_factory=dict
    )  # version -> state, code, msg
    loaded: dict[int, Loaded] = field(default_factory=dict)


def _chosen(policy: tuple[str, Any], found: list[int]) -> list[int]:
    """The versions a version policy serves among those ``found`` (sorted): TF Serving's
    ``ServableVersionPolicy`` (tensorflow_serving/config/file_system_storage_path_source.proto):
    ``latest {num_versions: N}`` the N highest, ``all`` every one, ``specific`` the listed."""
    kind, arg = policy
    if kind == "specific":
        return [v for v in found if v in arg]
    if kind == "all":
        return list(found)
    return found[-int(arg) :]


class ModelManager:
    """The stand-in's model set. Thread-safe: the REST and gRPC servers share it.

    ``allow_unavailable_labels``: the real server's
    ``--allow_version_labels_for_unavailable_models``. ``load_delay_s``: how long versions
    other than a model's latest stay LOADING after a reload."""

    def __init__(
        self,
        allow_unavailable_labels: bool = False,
        load_delay_s: float = 0.3,
        batching: BatchingConfig | None = None,
        on_batch: Callable[[str, int, BatchRecord], None] = lambda n, v, r: None,
    ) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, _Entry] = {}
        self._gone: dict[str, dict[int, tuple[str, str, str]]] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self.allow_unavailable_labels = allow_unavailable_labels
        self.load_delay_s = load_delay_s  # before the non-latest versions load
        self.batching = batching or BatchingConfig()
        self.on_batch = on_batch
        self.config_text = ""  # the config as last received (STAND-IN-only readback)

    def _load(
        self, name: str, base_path: str, policy: tuple[str, Any], old: _Entry | None
    ) -> _Entry:
        """The model's entry for ``policy``: versions ``old`` has loaded from the same base
        path and still chosen stay as they are; the others are loaded."""
        e = _Entry(base_path, policy)
        root = Path(base_path)
        if not root.is_dir():
            raise ServingError(
                "NOT_FOUND", f"Could not find base path {base_path} for servable {name}"
            )
        found = sorted(
            int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "model.npz").exists()
        )
        chosen = _chosen(policy, found)
        if not chosen:
            raise ServingError(
                "NOT_FOUND", f"No versions of servable {name} found under base path {base_path}"
            )
        kept = {} if old is None or old.base_path != base_path else old.loaded
        for v in chosen:
            if v in kept:
                e.loaded[v] = kept[v]
                e.states[v] = ("AVAILABLE", "OK", "")
        # The real server's reload waits only for each model's latest version
        # (ServerCore::WaitUntilConfiguredModelsAvailable in server_core.cc); the others
        # load after it, so a label on one of them fails in the same reload.
        e.states.update((v, ("LOADING", "OK", "")) for v in chosen if v not in kept)
        if chosen[-1] not in kept:
            self._load_version(e, name, root, chosen[-1])
        rest = [v for v in chosen[:-1] if v not in kept]
        if rest:
            threading.Thread(
                target=self._load_later, args=(e, name, root, rest), daemon=True
            ).start()
        return e

    def _batcher(self, name: str, v: int, d: Path, run: Callable[..., Any]) -> Batcher | None:
        """The version's batcher: per-model parameters read from its directory now, as it
        loads (TF Serving reads them nowhere else)."""
        cfg = self.batching
        if not cfg.enabled:
            return None
        params = cfg.defaults
        f = d / BATCHING_PARAMS
        if cfg.per_model and f.exists():
            try:
                fields = parse_batching_text(f.read_text(), str(f))
                params = BatchingParams.from_fields(fields, cfg.defaults)
            except (ValidationError, ValueError) as err:
                raise ServingError("INVALID_ARGUMENT", f"{f}: {err}") from None
        return Batcher(params, run, lambda r: self.on_batch(name, v, r), name=f"{name}-{v}")

    def _load_version(self, e: _Entry, name: str, root: Path, v: int) -> None:
        d = root / str(v)
        z = np.load(d / "model.npz")
        n = len([k for k in z.files if k.startswith("W")])
        layers = [(z[f"W{i}"], z[f"b{i}"]) for i in range(n)]
        cost = json.loads((d / "cost.json").read_text()) if (d / "cost.json").exists() else {}
        loaded = Loaded(
            name,
            v,
            layers,
            json.loads((d / "signature.json").read_text()),
            (float(cost.get("base_ms", 0)) / 1e3, float(cost.get("per_row_ms", 0)) / 1e3),
        )
        loaded.batcher = self._batcher(name, v, d, loaded.compute)
        e.loaded[v] = loaded  # one dict store: readers copy under the lock
        e.states[v] = ("AVAILABLE", "OK", "")

    def _load_later(self, e: _Entry, name: str, root: Path, versions: list[int]) -> None:
        time.sleep(self.load_delay_s)
        for v in versions:
            with self._lock:
                self._load_version(e, name, root, v)

    @staticmethod
    def _unload(versions: list[Loaded]) -> None:
        """Unload versions after the requests they hold ran (in the background, as the real
        server's UNLOADING)."""
        batchers = [x.batcher for x in versions if x.batcher is not None]
        if batchers:
            threading.Thread(target=lambda: [b.close() for b in batchers], daemon=True).start()

    def _label_map(self, config: list[ServedModel]) -> dict[str, dict[str, int]]:
        """The new label map, checked as the real server's ``UpdateModelVersionLabelMap``
        (tensorflow_serving/model_servers/server_core.cc) does: a label may only name a
        version that is AVAILABLE, else FAILED_PRECONDITION and the old map stays."""
        out: dict[str, dict[str, int]] = {}
        for c in config:
            for label, v in c.labels:
                e = self._models.get(c.name)
                if not self.allow_unavailable_labels and (e is None or v not in e.loaded):
                    raise ServingError(
                        "FAILED_PRECONDITION",
                        f"Request to assign label to version {v} of model {c.name}, "
                        "which is not currently available for inference",
                    )
                out.setdefault(c.name, {})[label] = v
        return out

    def reload(self, config: list[ServedModel], text: str = "") -> None:
        """Make the model set exactly ``config``: models first, then the label map."""
        with self._lock:
            self.config_text = text  # the real server keeps the new config even if a load fails
            new: dict[str, _Entry] = {}
            errors = []
            for c in config:
                old = self._models.get(c.name)
                if old is not None and old.base_path == c.base_path and old.policy == c.policy:
                    new[c.name] = old  # unchanged: stays loaded
                    continue
                try:
                    new[c.name] = self._load(c.name, c.base_path, c.policy, old)
                except ServingError as err:
                    errors.append(err)
                    self._gone[c.name] = {0: ("END", err.code, err.message)}
            gone: list[Loaded] = []
            for name, e in self._models.items():
                kept = new.get(name)
                gone += [
                    x for v, x in e.loaded.items() if kept is None or kept.loaded.get(v) is not x
                ]
                if name not in new:  # replaced set: everything not listed is unloaded
                    self._gone[name] = {v: ("END", "OK", "") for v in e.states}
            self._models = new
            for name in new:
                self._gone.pop(name, None)
            self._unload(gone)
            if errors:
                raise errors[0]
            self._labels = self._label_map(config)

    def resolve(self, name: str, label: str) -> int:
        """The version a label names; unknown: INVALID_ARGUMENT as the real server's
        ``ServerCore::GetModelVersionForLabel`` (REST 400)."""
        with self._lock:
            v = self._labels.get(name, {}).get(label)
        if v is None:
            raise ServingError("INVALID_ARGUMENT", f"Unrecognized servable version label: {label}")
        return v

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

"""The Triton repository of ``benchmarks/steer_vs_analyzer.py``: a two-step ensemble of real
Python-backend models (the harness's digits models), plus the helpers that load one
configuration of its composing models into the running server.

``digits_app`` (ensemble): image FP32 [8,8] -> ``digits_pre`` (standardize) -> features ->
``digits_wide`` (a wide random-feature network with a trained readout,
``integration/triton_harness/model_src/digits_wide.py``) -> label INT64 [1]. The operator's
starting configuration is one CPU instance per model and no dynamic batching (each request runs
alone); the composing models keep ``max_batch_size`` so a tuner may batch them.

Configurations are applied the way an operator does in explicit mode: the model's
``config.pbtxt`` is rewritten and ``POST /v2/repository/models/{m}/load`` reloads it.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "integration"))

import numpy as np  # noqa: E402
from triton_harness import build_repository, load_digits_split  # noqa: E402

SRC = REPO / "integration" / "triton_harness" / "model_src"

__all__ = [
    "APP",
    "STEPS",
    "ModelSetting",
    "build_app_repository",
    "input_data_file",
    "instance_count",
    "load_model",
    "model_config",
    "read_setting",
    "test_images",
    "write_setting",
]

APP = "digits_app"
STEPS = ("digits_pre", "digits_wide")
WIDTH = 4096
MAX_BATCH = 32


@dataclass(frozen=True)
class ModelSetting:
    """What a tuner sets on one composing model: instances, max batch and the batcher
    (``dynamic_batching`` False: off; else ``max_queue_delay_us`` and preferred sizes)."""

    instances: int = 1
    max_batch_size: int = MAX_BATCH
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.dynamic_batching,
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSetting:
        return cls(**{**d, "preferred_batch_sizes": tuple(d.get("preferred_batch_sizes", ()))})

    def describe(self) -> str:
        if not self.dynamic_batching:
            return f"{self.instances}x, batch off"
        pref = f" pref {list(self.preferred_batch_sizes)}" if self.preferred_batch_sizes else ""
        return (
            f"{self.instances}x, max batch {self.max_batch_size}, "
            f"delay {self.max_queue_delay_us} us{pref}"
        )


def _ensemble_config() -> str:
    # max_batch_size 1: clients send one image per request, and 1 keeps every max batch size
    # a tuner gives the composing models valid (an ensemble's may not exceed theirs)
    return f"""name: "{APP}"
platform: "ensemble"
max_batch_size: 1
input [ {{ name: "image", data_type: TYPE_FP32, dims: [8, 8] }} ]
output [ {{ name: "label", data_type: TYPE_INT64, dims: [1] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "digits_pre"
      model_version: -1
      input_map {{ key: "image" value: "image" }}
      output_map {{ key: "features" value: "features" }}
    }},
    {{
      model_name: "digits_wide"
      model_version: -1
      input_map {{ key: "features" value: "features" }}
      output_map {{ key: "label" value: "label" }}
    }}
  ]
}}
"""


# tensors of the composing models, as the harness builds them (a setting rewrites the rest)
_TENSORS = {
    "digits_pre": (
        '{ name: "image", data_type: TYPE_FP32, dims: [8, 8] }',
        '{ name: "features", data_type: TYPE_FP32, dims: [64] }',
    ),
    "digits_wide": (
        '{ name: "features", data_type: TYPE_FP32, dims: [64] }',
        '{ name: "label", data_type: TYPE_INT64, dims: [1] }',
    ),
}


def write_setting(repo: Path, model: str, s: ModelSetting) -> None:
    """Write ``model``'s whole config.pbtxt for setting ``s`` (whatever was there before,
    such as a Model Analyzer variant, is replaced)."""
    inp, out = _TENSORS[model]
    text = (
        f'name: "{model}"\nbackend: "python"\nmax_batch_size: {s.max_batch_size}\n'
        f"input [ {inp} ]\noutput [ {out} ]\n"
        f"instance_group [{{ count: {s.instances}, kind: KIND_CPU }}]\n"
    )
    if s.dynamic_batching:
        pref = "".join(f"  preferred_batch_size: {b}\n" for b in s.preferred_batch_sizes)
        text += f"dynamic_batching {{\n{pref}  max_queue_delay_microseconds: {s.max_queue_delay_us}\n}}\n"
    (Path(repo) / model / "config.pbtxt").write_text(text)


def _train_wide(repo: Path, seed: int) -> float:
    """Fixed random ReLU layers and a ridge readout (solved in the dual: 1,257 x 1,257), on
    the features ``digits_pre`` computes; returns the held-out accuracy."""
    xtr, xte, ytr, yte = load_digits_split(seed)
    pre = repo / "digits_pre" / "1"
    mean, std = np.load(pre / "mean.npy"), np.load(pre / "std.npy")
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, WIDTH)) * np.sqrt(2 / 64)).astype(np.float32)
    w2 = (rng.standard_normal((WIDTH, WIDTH)) * np.sqrt(2 / WIDTH)).astype(np.float32)

    def hidden(x: np.ndarray) -> np.ndarray:
        h = np.maximum(((x - mean) / std).astype(np.float32) @ w1, 0.0)
        return np.maximum(h @ w2, 0.0)

    h = hidden(xtr)
    y = np.eye(10, dtype=np.float32)[ytr]
    gram = h @ h.T
    alpha = np.linalg.solve(gram + 1e-2 * np.trace(gram) / len(h) * np.eye(len(h)), y)
    w_out = (h.T @ alpha).astype(np.float32)
    vdir = repo / "digits_wide" / "1"
    shutil.rmtree(vdir.parent, ignore_errors=True)
    vdir.mkdir(parents=True)
    shutil.copy2(SRC / "digits_wide.py", vdir / "model.py")
    for key, arr in (("w1", w1), ("w2", w2), ("w_out", w_out)):
        np.save(vdir / f"{key}.npy", arr)
    return float(((hidden(xte) @ w_out).argmax(axis=1) == yte).mean())


def build_app_repository(repo: Path, seed: int = 0) -> float:
    """Train the models and write the ensemble's repository under ``repo``, every composing
    model at the operator's configuration; returns digits_wide's held-out accuracy."""
    repo = Path(repo)
    build_repository(repo, seed=seed, max_batch_size=MAX_BATCH)
    acc = _train_wide(repo, seed)
    for m in STEPS:
        write_setting(repo, m, ModelSetting())
    (Path(repo) / APP / "1").mkdir(parents=True, exist_ok=True)
    (Path(repo) / APP / "config.pbtxt").write_text(_ensemble_config())
    return acc


def test_images(seed: int = 0) -> np.ndarray:
    """Held-out digit images (N, 8, 8) float32, the requests' inputs."""
    _, xte, _, _ = load_digits_split(seed)
    return xte.reshape(-1, 8, 8).astype(np.float32)


def input_data_file(path: Path, n: int = 64, seed: int = 0) -> Path:
    """perf_analyzer ``--input-data`` JSON of real held-out digit images (random data would
    put pixels outside [0, 16], which ``digits_pre`` refuses)."""
    _, xte, _, _ = load_digits_split(seed)
    rows = [{"image": [float(v) for v in xte[i % len(xte)]]} for i in range(n)]
    Path(path).write_text(json.dumps({"data": rows}))
    return Path(path)


def _http(base: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw else {}


def load_model(base: str, model: str) -> None:
    """Explicit-mode (re)load of ``model`` from its config.pbtxt in the repository."""
    _http(base, f"/v2/repository/models/{model}/load", {})


def model_config(base: str, model: str) -> dict[str, Any]:
    return dict(_http(base, f"/v2/models/{model}/config"))


def instance_count(cfg: dict[str, Any]) -> int:
    return sum(int(g.get("count", 1)) for g in cfg.get("instance_group", []) or [{}])


def read_setting(cfg: dict[str, Any]) -> ModelSetting:
    """The setting a loaded model runs with (its config as the server reports it)."""
    db = cfg.get("dynamic_batching")
    return ModelSetting(
        instances=instance_count(cfg),
        max_batch_size=int(cfg.get("max_batch_size", 0)),
        dynamic_batching=db is not None,
        max_queue_delay_us=int((db or {}).get("max_queue_delay_microseconds", 0)),
        preferred_batch_sizes=tuple(int(b) for b in (db or {}).get("preferred_batch_size", [])),
    )

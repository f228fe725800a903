"""A Triton model repository of real Python-backend models, trained at setup time.

The models work on scikit-learn's bundled handwritten digits (1,797 labelled 8x8 images):

- ``digits_pre``: image FP32 [8,8] (pixels 0..16) -> features FP32 [64] (standardized); a batch
  with a pixel outside [0, 16] fails with a model error (used to test error surfacing);
- ``digits_mlp``: features -> probs FP32 [10] and label INT64 [1] (one-hidden-layer MLP trained
  with scikit-learn, weights saved as .npy and evaluated with numpy in the server);
- ``digits_knn``: features -> label INT64 [1] (3-nearest neighbours over the training set; more
  work per item, used by the overhead benchmark);
- ``digit_name``: label INT64 [1] -> name BYTES [1] (string outputs).

``write_sleep_model`` adds the bundled sleep model's cost model (no training): x FP32 [1]
echoed as y after ``base_s + per_item_s * rows`` per batch, behind a dynamic batcher whose
queue policy rejects a request at its timeout.

Training runs in the caller's environment (scikit-learn); the server only needs numpy.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MODELS",
    "Digits",
    "build_repository",
    "digits_stage_pipeline",
    "load_digits_split",
    "write_ensemble",
    "write_sleep_model",
]

SRC = Path(__file__).parent / "model_src"
MODELS = ("digits_pre", "digits_mlp", "digits_knn", "digit_name")


@dataclass(frozen=True)
class Digits:
    """Held-out split for checking predictions: raw images (N, 8, 8) float32, labels (N,)."""

    test_images: np.ndarray
    test_labels: np.ndarray
    mlp_accuracy: float  # measured in-process on the test split, for comparison with the server


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.3, random_state=seed, stratify=y
    )
    return xtr, xte, ytr, yte


def _config(
    name: str,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    max_batch_size: int,
    instances: int,
) -> str:
    def tensors(items: list[tuple[str, str, list[int]]]) -> str:
        return ",\n".join(
            f'  {{ name: "{n}", data_type: {t}, dims: [{", ".join(map(str, d))}] }}'
            for n, t, d in items
        )

    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{tensors(inputs)}\n]\noutput [\n{tensors(outputs)}\n]\n"
        f"instance_group [{{ count: {instances}, kind: KIND_CPU }}]\n"
    )


def _write_model(repo: Path, name: str, config: str, arrays: dict[str, np.ndarray]) -> None:
    mdir = repo / name
    vdir = mdir / "1"
    shutil.rmtree(mdir, ignore_errors=True)
    vdir.mkdir(parents=True)
    shutil.copy2(SRC / f"{name}.py", vdir / "model.py")
    for key, arr in arrays.items():
        np.save(vdir / f"{key}.npy", arr)
    (mdir / "config.pbtxt").write_text(config)


def build_repository(
    repo: Path,
    seed: int = 0,
    max_batch_size: int = 64,
    aliases: Mapping[str, str] | None = None,
) -> Digits:
    """Train the models and write the repository under ``repo``; returns the held-out split.

    ``aliases`` adds copies of models under other names (``{"knn_b": "digits_knn"}``), so two
    configurations of the same model can be loaded side by side (the overhead benchmark).
    """
    from sklearn.neural_network import MLPClassifier
    from threadpoolctl import threadpool_limits

    repo = Path(repo)
    repo.mkdir(parents=True, exist_ok=True)
    xtr, xte, ytr, yte = load_digits_split(seed)
    mean = xtr.mean(axis=0).astype(np.float32)
    std = (xtr.std(axis=0) + 1e-3).astype(np.float32)
    ftr = (xtr - mean) / std
    # One BLAS thread: on a shared 2-core machine, BLAS's default thread pool makes this
    # tiny fit take tens of seconds instead of about one.
    with threadpool_limits(1):
        mlp = MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, random_state=seed)
        mlp.fit(ftr, ytr)
    acc = float(mlp.score((xte - mean) / std, yte))
    img = [("image", "TYPE_FP32", [8, 8])]
    feat = [("features", "TYPE_FP32", [64])]
    label = [("label", "TYPE_INT64", [1])]
    mb = max_batch_size
    _write_model(
        repo,
        "digits_pre",
        _config("digits_pre", img, feat, mb, 1),
        {"mean": mean, "std": std},
    )
    _write_model(
        repo,
        "digits_mlp",
        _config("digits_mlp", feat, [("probs", "TYPE_FP32", [10]), *label], mb, 1),
        {
            "w1": mlp.coefs_[0].astype(np.float32),
            "b1": mlp.intercepts_[0].astype(np.float32),
            "w2": mlp.coefs_[1].astype(np.float32),
            "b2": mlp.intercepts_[1].astype(np.float32),
        },
    )
    _write_model(
        repo,
        "digits_knn",
        _config("digits_knn", feat, label, mb, 1),
        {"train_x": ftr.astype(np.float32), "train_y": ytr},
    )
    _write_model(
        repo,
        "digit_name",
        _config("digit_name", label, [("name", "TYPE_STRING", [1])], mb, 1),
        {},
    )
    for alias, name in (aliases or {}).items():
        if name not in MODELS:
            raise ValueError(f"alias {alias!r}: unknown model {name!r} (known: {MODELS})")
        shutil.rmtree(repo / alias, ignore_errors=True)
        shutil.copytree(repo / name, repo / alias)
        cfg = (repo / alias / "config.pbtxt").read_text()
        (repo / alias / "config.pbtxt").write_text(
            cfg.replace(f'name: "{name}"', f'name: "{alias}"', 1)
        )
    return Digits(test_images=xte.reshape(-1, 8, 8), test_labels=yte, mlp_accuracy=acc)


async def digits_stage_pipeline(x: Any, ctx: Any) -> int:
    """``digits_pre``, then the stage ``cls`` (whichever digit classifier variant serves it):
    an 8x8 image -> its label. For the model-variant test on Triton."""
    features = await ctx.predict("pre", x)
    return int(np.asarray(await ctx.predict("cls", features)).reshape(-1)[0])


async def digits_pre_pipeline(x: Any, ctx: Any) -> Any:
    """``digits_pre`` alone: an 8x8 image -> its 64 standardized features."""
    return await ctx.predict("pre", x)


def write_ensemble(
    repo: Path,
    name: str = "digits",
    steps: tuple[str, str] = ("digits_pre", "digits_mlp"),
    max_batch_size: int = 64,
) -> None:
    """A two-step ensemble over the repository's models: ``digits_pre`` (image -> features),
    then ``digits_mlp`` (features -> label), as an operator would write it."""
    if steps != ("digits_pre", "digits_mlp"):
        raise ValueError(f"steps: only ('digits_pre', 'digits_mlp'), not {steps!r}")
    (Path(repo) / name / "1").mkdir(parents=True, exist_ok=True)
    (Path(repo) / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "image", data_type: TYPE_FP32, dims: [8, 8] } ]\n'
        'output [ { name: "label", data_type: TYPE_INT64, dims: [1] } ]\n'
        "ensemble_scheduling { step [\n"
        '  { model_name: "digits_pre", model_version: -1,\n'
        '    input_map { key: "image" value: "image" } '
        'output_map { key: "features" value: "f" } },\n'
        '  { model_name: "digits_mlp", model_version: -1,\n'
        '    input_map { key: "features" value: "f" } output_map { key: "label" value: "label" } }\n'
        "] }\n"
    )


def write_sleep_model(
    repo: Path,
    name: str,
    *,
    base_s: float,
    per_item_s: float = 0.0,
    max_batch_size: int = 8,
    timeout_us: int,
    allow_timeout_override: bool = False,
) -> None:
    """The sleep model under ``repo/name``: one CPU instance, a dynamic batcher with no queue
    delay whose queue policy REJECTs a request waiting past ``timeout_us`` (Triton 2.51 applies
    a request's own ``timeout`` only with ``allow_timeout_override`` and a nonzero default)."""
    if timeout_us <= 0:
        raise ValueError(f"timeout_us: expected > 0 (0 means no timeout), got {timeout_us!r}")
    mdir = Path(repo) / name
    (mdir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SRC / "sleep.py", mdir / "1" / "model.py")
    override = "true" if allow_timeout_override else "false"
    (mdir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [1] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [1] } ]\n'
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
        "dynamic_batching {\n"
        "  max_queue_delay_microseconds: 0\n"
        "  default_queue_policy {\n"
        "    timeout_action: REJECT\n"
        f"    default_timeout_microseconds: {timeout_us}\n"
        f"    allow_timeout_override: {override}\n"
        "  }\n"
        "}\n"
        f'parameters {{ key: "base_s" value: {{ string_value: "{base_s!r}" }} }}\n'
        f'parameters {{ key: "per_item_s" value: {{ string_value: "{per_item_s!r}" }} }}\n'
    )

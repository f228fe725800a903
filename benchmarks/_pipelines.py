"""Synthetic pipelines and profiles shaped like the four InferLine pipelines (paper Fig. 2).

Reusable by every benchmark (planner, tuner, estimator): ``PIPELINES[name]()`` returns
``(Pipeline, Profiles)``; ``image_processing()``, ``video_monitoring()``, ``social_media()`` and
``tf_cascade()`` are the same builders by name.

How the numbers were chosen (all latencies in seconds, prices from ``DEFAULT_CATALOG``:
cpu 0.0665 $/h, gpu-k80 0.634 $/h, gpu-v100 2.528 $/h):

* A batch of ``b`` takes ``alpha + beta * b`` on a given hardware. GPU models have a large fixed
  cost ``alpha`` (kernel launch, weight reads) and a small per-item cost ``beta``, so batching
  raises their throughput (the shape of the paper's Fig. 3 / thesis Fig. 4.3). CPU-only stages
  (image preprocessing, license-plate OCR) have ``alpha = 0``: batching gives no throughput.
* The V100 is about 2-3x faster than the K80 per batch, but the K80 is 4x cheaper, so the
  planner's hardware downgrade pays off once the SLO leaves room for larger K80 batches (the
  paper's observation that a looser SLO lets the planner move a stage to cheaper hardware).
* Heavy vision models are far too slow on a CPU (ResNet152 runs at about 0.6 q/s on a CPU in
  the paper); they keep a CPU profile so that a downgrade to CPU is tried and rejected.
* Light text models (language identification, topic classification) are cheap enough on a CPU
  that a CPU replica is the cost-efficient choice when the SLO allows it (paper Fig. 9: the
  language-identification model moves from GPU to CPU as the SLO grows from 0.1 to 0.15 s).
* Scale factors (conditional branches) are those of the paper's descriptions: not every frame
  has a vehicle or a person, most posts need no translation, the slow model of a cascade runs
  only when the fast one is not confident.

Batch sizes are powers of two: 1..64 on GPUs, 1..16 on CPUs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from inferline.core import Pipeline, Profiles

__all__ = [
    "PIPELINES",
    "add_grid_arguments",
    "image_processing",
    "linear_latencies",
    "social_media",
    "tf_cascade",
    "video_monitoring",
]

GPU_BATCHES = (1, 2, 4, 8, 16, 32, 64)
CPU_BATCHES = (1, 2, 4, 8, 16)


def linear_latencies(alpha_s: float, beta_s: float, batches: tuple[int, ...]) -> dict[int, float]:
    """``{b: alpha + beta * b}``: a batch's latency on one hardware kind."""
    return {b: round(alpha_s + beta_s * b, 9) for b in batches}


def _gpu_model(
    v100: tuple[float, float], k80: tuple[float, float], cpu_per_item_s: float | None
) -> dict[str, dict[int, float]]:
    hw = {
        "gpu-v100": linear_latencies(*v100, GPU_BATCHES),
        "gpu-k80": linear_latencies(*k80, GPU_BATCHES),
    }
    if cpu_per_item_s is not None:
        hw["cpu"] = linear_latencies(0.0, cpu_per_item_s, CPU_BATCHES)
    return hw


def _cpu_only(per_item_s: float) -> dict[str, dict[int, float]]:
    # No internal parallelism: a batch of b costs b single queries (no batching benefit).
    return {"cpu": linear_latencies(0.0, per_item_s, CPU_BATCHES)}


# Per-model profiles shared by the pipelines: (alpha, beta) on V100 and K80, CPU per-item cost.
_MODELS: dict[str, dict[str, dict[int, float]]] = {
    "preprocess": _cpu_only(0.008),  # crop/resize; ~125 q/s per core
    "resnet152": _gpu_model((0.010, 0.0028), (0.022, 0.0085), 1.2),
    "yolo": _gpu_model((0.015, 0.0040), (0.035, 0.0120), 2.0),
    "vehicle": _gpu_model((0.006, 0.0012), (0.012, 0.0040), 0.15),
    "person": _gpu_model((0.007, 0.0014), (0.014, 0.0045), 0.18),
    "alpr": _cpu_only(0.030),  # OpenALPR-like plate reader, CPU only
    "lang-id": {
        "gpu-v100": linear_latencies(0.003, 0.0002, GPU_BATCHES),
        "gpu-k80": linear_latencies(0.004, 0.0004, GPU_BATCHES),
        "cpu": linear_latencies(0.002, 0.0040, CPU_BATCHES),
    },
    "nmt": _gpu_model((0.020, 0.0040), (0.040, 0.0120), 0.5),
    "topic": {
        "gpu-v100": linear_latencies(0.004, 0.0004, GPU_BATCHES),
        "gpu-k80": linear_latencies(0.006, 0.0008, GPU_BATCHES),
        "cpu": linear_latencies(0.001, 0.0060, CPU_BATCHES),
    },
    "fast": _gpu_model((0.006, 0.0012), (0.012, 0.0040), 0.15),  # ResNet50-like
    "slow": _gpu_model((0.012, 0.0030), (0.025, 0.0090), 0.4),  # Inception-like
}


def _profiles(models: tuple[str, ...]) -> Profiles:
    return Profiles.from_latencies({m: _MODELS[m] for m in models})


def image_processing() -> tuple[Pipeline, Profiles]:
    """Preprocess (CPU) -> ResNet152 classification (GPU)."""
    p = Pipeline.linear("image-processing", ["preprocess", "resnet152"])
    return p, _profiles(p.models)


def video_monitoring() -> tuple[Pipeline, Profiles]:
    """YOLO detection -> vehicle (60%) and person (50%) classifiers; plates for 30% (vehicles)."""
    p = Pipeline(
        "video-monitoring",
        ("yolo", "vehicle", "person", "alpr"),
        (("yolo", "vehicle"), ("yolo", "person"), ("vehicle", "alpr")),
        {"vehicle": 0.6, "person": 0.5, "alpr": 0.3},
    )
    return p, _profiles(p.models)


def social_media() -> tuple[Pipeline, Profiles]:
    """Image branch (preprocess -> ResNet152) and text branch (language id -> translation for
    the 30% non-English posts -> topic classification)."""
    p = Pipeline(
        "social-media",
        ("preprocess", "resnet152", "lang-id", "nmt", "topic"),
        (
            ("preprocess", "resnet152"),
            ("lang-id", "nmt"),
            ("lang-id", "topic"),
            ("nmt", "topic"),
        ),
        {"nmt": 0.3},
    )
    return p, _profiles(p.models)


def tf_cascade() -> tuple[Pipeline, Profiles]:
    """Preprocess -> fast model; the slow model runs for the 30% the fast one is unsure of."""
    p = Pipeline(
        "tf-cascade",
        ("preprocess", "fast", "slow"),
        (("preprocess", "fast"), ("fast", "slow")),
        {"slow": 0.3},
    )
    return p, _profiles(p.models)


PIPELINES: dict[str, Callable[[], tuple[Pipeline, Profiles]]] = {
    "image-processing": image_processing,
    "video-monitoring": video_monitoring,
    "social-media": social_media,
    "tf-cascade": tf_cascade,
}


def add_grid_arguments(ap: argparse.ArgumentParser) -> None:
    """``--pipelines`` and ``--cvs``: the grid the planner benchmarks share."""
    ap.add_argument(
        "--pipelines",
        nargs="+",
        default=list(PIPELINES),
        choices=list(PIPELINES),
        help="pipelines of _pipelines.py to plan (default: all)",
    )
    ap.add_argument(
        "--cvs",
        nargs="+",
        type=float,
        default=[1.0, 4.0],
        help="coefficients of variation of the traces (default 1 4)",
    )

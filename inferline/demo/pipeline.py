"""The demo pipeline: preprocessing, a fast classifier, and a conditional slower one.

``digits(x, ctx)``: raw 8x8 digit pixels (64 numbers in 0..16) -> features (``preprocess``)
-> class probabilities from the torch MLP (``mlp``); when the MLP is not confident (top
probability under ``threshold``) the random forest (``forest``) decides instead. So
``forest`` sees only a fraction of the queries: the profiler's trace derives that scale factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferline.core import ModelSpec
from inferline.demo.models import digits_split

__all__ = [
    "DEFAULT_THRESHOLD",
    "MODELS",
    "deployment_dict",
    "digits",
    "digits_deployment",
    "make_pipeline",
    "sample_inputs",
    "test_inputs",
]

DEFAULT_THRESHOLD = 0.9

MODELS = (
    ModelSpec("preprocess", "inferline.demo.models:preprocess"),
    ModelSpec("mlp", "inferline.demo.models:mlp", {"hidden": 128, "steps": 50}),
    ModelSpec("forest", "inferline.demo.models:forest", {"trees": 200}),
)


def make_pipeline(threshold: float = DEFAULT_THRESHOLD) -> Any:
    """The pipeline function with a given confidence threshold for escalating to the forest."""

    async def digits(x: Any, ctx: Any) -> dict[str, Any]:
        feats = await ctx.predict("preprocess", x)
        p = await ctx.predict("mlp", feats)
        model = "mlp"
        if float(np.max(p)) < threshold:
            p = await ctx.predict("forest", feats)
            model = "forest"
        return {"label": int(np.argmax(p)), "confidence": float(np.max(p)), "model": model}

    digits.__qualname__ = "digits"
    return digits


digits = make_pipeline()


def sample_inputs(n: int = 200, seed: int = 0) -> list[np.ndarray]:
    """Held-out digit images (float32[64], raw 0..16) for profiling and tracing."""
    _, _, xt, _ = digits_split(seed)
    return [xt[i % len(xt)] for i in range(n)]


def test_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """All held-out images and labels (the replay sends these)."""
    _, _, xt, yt = digits_split(seed)
    return xt, yt


def deployment_dict(
    slo_ms: float = 100.0, backend: str = "local://?oversubscribe=1", name: str = "digits"
) -> dict[str, Any]:
    """The demo's deployment description (format ``inferline.deployment/1``)."""
    return digits_deployment(
        name,
        backend,
        MODELS,
        "inferline.demo.pipeline:digits",
        slo_ms,
        "Handwritten digit classification (scikit-learn digits)",
        max_queue=2000,
    )


def digits_deployment(
    name: str,
    backend: str,
    models: Sequence[ModelSpec],
    pipeline: str,
    slo_ms: float,
    description: str,
    max_queue: int,
) -> dict[str, Any]:
    """A deployment of one ``digits`` app over raw 8x8 digit images (``float32[64]``)."""
    return {
        "format": "inferline.deployment/1",
        "name": name,
        "backend": backend,
        "models": [m.to_dict() for m in models],
        "apps": {
            "digits": {
                "pipeline": pipeline,
                "slo_ms": slo_ms,
                "default_output": {"label": -1, "confidence": 0.0, "model": "default"},
                "input": {"dtype": "float32", "shape": [64]},
                "description": description,
            }
        },
        "sample_inputs": "inferline.demo.pipeline:sample_inputs",
        "queue": {"max_queue": max_queue, "expire_late": False, "max_retries": 1},
    }

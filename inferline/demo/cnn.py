"""A GPU-sized stage for the digits pipeline: a convolutional classifier (torch).

``digits_cnn(x, ctx)``: raw 8x8 digit pixels -> features (the demo's ``preprocess``) -> class
probabilities from ``cnn``. The network upsamples the 8x8 features to 32x32 and runs four 3x3
convolutions of ``width`` .. 2 * ``width`` channels, so its cost grows with ``width`` squared:
at the default 256 one image takes tens of milliseconds on one CPU core and the batch of 32
well under that on a GPU, the trade the planner makes between a cheap CPU and a GPU.

:func:`train_cnn` trains the network on scikit-learn's digits (on the GPU when there is one)
and saves its ``state_dict``; every replica loads that file with ``weights_only=True`` (no
pickle), so all replicas hold the same trained weights. A replica runs on CUDA when the
runtime gave it a GPU (``CUDA_VISIBLE_DEVICES``), else on its CPU cores.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferline.core import ModelSpec
from inferline.demo.models import _as_batch, _features, digits_split
from inferline.demo.pipeline import digits_deployment

__all__ = ["CNN", "cnn", "cnn_deployment_dict", "digits_cnn", "train_cnn"]

log = logging.getLogger(__name__)

DEFAULT_WIDTH = 256


def build_cnn(width: int) -> Any:
    """The network: 8x8 -> 32x32, conv w (32x32), 2w (16x16), 2w (8x8), 2w (8x8), pool, fc 10."""
    import torch
    from torch import nn

    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")

    def block(cin: int, cout: int, stride: int) -> list[Any]:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    w2 = 2 * width
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Upsample(scale_factor=4, mode="bilinear", align_corners=False),
        *block(1, width, 1),
        *block(width, w2, 2),
        *block(w2, w2, 2),
        *block(w2, w2, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(w2, 10),
    ).to(torch.float32)


def train_cnn(
    path: str | Path,
    width: int = DEFAULT_WIDTH,
    epochs: int = 8,
    seed: int = 0,
    device: str | None = None,
) -> dict[str, float]:
    """Train on the digits training split, save the ``state_dict`` to ``path``; returns the
    held-out accuracy, the device and the seconds it took."""
    import torch

    t0 = time.perf_counter()
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    x, y, xt, yt = digits_split(seed)
    xs = torch.from_numpy(_features(x)).to(dev)
    ys = torch.from_numpy(y).to(dev)
    net = build_cnn(width).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    lossf = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xs), generator=gen).split(64):
            idx = idx.to(dev)
            opt.zero_grad()
            lossf(net(xs[idx]), ys[idx]).backward()
            opt.step()
    net.eval()
    with torch.inference_mode():
        pred = net(torch.from_numpy(_features(xt)).to(dev)).argmax(1).cpu().numpy()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in net.state_dict().items()}, str(path))
    return {
        "accuracy": float((pred == yt).mean()),
        "device": dev,
        "seconds": time.perf_counter() - t0,
    }


class CNN:
    """The trained network as a model container; outputs float32[10] probabilities."""

    def __init__(self, weights: str, width: int = DEFAULT_WIDTH) -> None:
        self.weights = weights
        self.width = width
        self._net: Any = None
        self.device = "cpu"

    def load(self) -> None:
        import torch

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        net = build_cnn(self.width)
        net.load_state_dict(torch.load(self.weights, map_location="cpu", weights_only=True))
        self._net = net.to(self.device).eval()
        log.info("cnn (width %d) on %s", self.width, self.device)

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        import torch

        if self._net is None:
            self.load()
        x = torch.from_numpy(_as_batch(inputs, "cnn")).to(self.device)
        with torch.inference_mode():
            p = torch.softmax(self._net(x), dim=1).cpu().numpy()
        return list(p.astype(np.float32))


def cnn(weights: str, width: int = DEFAULT_WIDTH) -> CNN:
    return CNN(weights, width)


async def digits_cnn(x: Any, ctx: Any) -> dict[str, Any]:
    feats = await ctx.predict("preprocess", x)
    p = await ctx.predict("cnn", feats)
    return {"label": int(np.argmax(p)), "confidence": float(np.max(p)), "model": "cnn"}


def cnn_deployment_dict(
    weights: str | Path,
    width: int = DEFAULT_WIDTH,
    slo_ms: float = 100.0,
    backend: str = "local://",
    name: str = "digits-cnn",
) -> dict[str, Any]:
    """A deployment (``inferline.deployment/1``) of ``digits_cnn`` with the CNN at ``weights``."""
    models = (
        ModelSpec("preprocess", "inferline.demo.models:preprocess"),
        ModelSpec("cnn", "inferline.demo.cnn:cnn", {"weights": str(weights), "width": width}),
    )
    return digits_deployment(
        name,
        backend,
        models,
        "inferline.demo.cnn:digits_cnn",
        slo_ms,
        "Handwritten digit classification by a CNN (GPU-sized)",
        max_queue=5000,
    )

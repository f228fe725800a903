"""Triton Python-backend model: a one-hidden-layer MLP digit classifier (numpy weights)."""

import os
import sys

# The stub's interpreter ignores PYTHONPATH; the harness names the model environment (numpy<2).
_site = os.environ.get("INFERLINE_TRITON_SITE")
if _site and _site not in sys.path:
    sys.path.insert(0, _site)

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        here = Path(__file__).parent
        self.w1 = np.load(here / "w1.npy")
        self.b1 = np.load(here / "b1.npy")
        self.w2 = np.load(here / "w2.npy")
        self.b2 = np.load(here / "b2.npy")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        sizes = [len(x) for x in xs]
        x = np.concatenate(xs).astype(np.float32)
        h = np.maximum(x @ self.w1 + self.b1, 0.0)
        z = h @ self.w2 + self.b2
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
        label = p.argmax(axis=1).astype(np.int64).reshape(-1, 1)
        out, start = [], 0
        for n in sizes:
            sl = slice(start, start + n)
            start += n
            out.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("probs", p[sl]), pb_utils.Tensor("label", label[sl])]
                )
            )
        return out

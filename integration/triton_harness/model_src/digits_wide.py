"""Triton Python-backend model: a wide random-feature network digit classifier.

Two fixed random ReLU layers (64 -> 4096 -> 4096, He-scaled, seeded) and a ridge-regression
readout trained on them at setup (``benchmarks/_steer_models.py``). The 4096 x 4096 layer
(64 MB of float32) makes one request a memory-bound matrix-vector product, while a batch
reads the weights once: real work whose cost per item falls with the batch size, like a
larger network's.
"""

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
        self.w1 = np.load(here / "w1.npy").astype(np.float32)
        self.w2 = np.load(here / "w2.npy").astype(np.float32)
        self.w_out = np.load(here / "w_out.npy").astype(np.float32)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        sizes = [len(x) for x in xs]
        x = np.concatenate(xs).astype(np.float32)
        h = np.maximum(x @ self.w1, 0.0)
        h = np.maximum(h @ self.w2, 0.0)
        label = (h @ self.w_out).argmax(axis=1).astype(np.int64).reshape(-1, 1)
        out, start = [], 0
        for n in sizes:
            out.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("label", label[start : start + n])])
            )
            start += n
        return out

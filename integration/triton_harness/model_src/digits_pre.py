"""Triton Python-backend model: standardize 8x8 digit images (0..16) into 64 features."""

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
        self.mean = np.load(here / "mean.npy").astype(np.float32)
        self.std = np.load(here / "std.npy").astype(np.float32)

    def execute(self, requests):
        # Requests grouped by Triton's dynamic batcher are computed together.
        xs = [pb_utils.get_input_tensor_by_name(r, "image").as_numpy() for r in requests]
        sizes = [len(x) for x in xs]
        bad = [not np.isfinite(x).all() or x.min() < 0 or x.max() > 16 for x in xs]
        x = np.concatenate(xs).reshape(-1, 64).astype(np.float32)
        feats = (x - self.mean) / self.std
        out, start = [], 0
        for n, is_bad in zip(sizes, bad, strict=True):
            part = feats[start : start + n]
            start += n
            if is_bad:
                err = pb_utils.TritonError("image pixels must be finite and within [0, 16]")
                out.append(pb_utils.InferenceResponse(output_tensors=[], error=err))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("features", part)]))
        return out

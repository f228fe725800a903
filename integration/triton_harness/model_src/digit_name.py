"""Triton Python-backend model: digit label (INT64) to its English name (BYTES)."""

import os
import sys

# The stub's interpreter ignores PYTHONPATH; the harness names the model environment (numpy<2).
_site = os.environ.get("INFERLINE_TRITON_SITE")
if _site and _site not in sys.path:
    sys.path.insert(0, _site)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            labels = pb_utils.get_input_tensor_by_name(r, "label").as_numpy().reshape(-1)
            names = np.array(
                [[NAMES[int(v)].encode() if 0 <= v < 10 else b"?"] for v in labels],
                dtype=np.object_,
            )
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("name", names)]))
        return out

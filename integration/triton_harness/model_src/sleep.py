"""Triton Python-backend model: the bundled sleep model's cost in Triton. Each batch sleeps
``base_s + per_item_s * rows`` (the config's ``parameters``) and echoes ``x`` as ``y``."""

import json
import os
import sys
import time

# The stub's interpreter ignores PYTHONPATH; the harness names the model environment (numpy<2).
_site = os.environ.get("INFERLINE_TRITON_SITE")
if _site and _site not in sys.path:
    sys.path.insert(0, _site)

import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.base_s = float(params["base_s"]["string_value"])
        self.per_item_s = float(params["per_item_s"]["string_value"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        time.sleep(self.base_s + self.per_item_s * sum(len(x) for x in xs))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for x in xs]

"""The conformance suite over the bundled runtime (``local://``). The TF Serving adapter runs
it in ``integration/test_tfserving.py`` (it needs a server); Triton can do the same."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from conformance import run_conformance

from inferline.adapters import PluginHost
from inferline.core import ModelSpec


@pytest.mark.timeout(120)
def test_local_backend_conforms() -> None:
    core = min(os.sched_getaffinity(0))
    host = PluginHost.default()
    spec = ModelSpec("double", "inferline.adapters.local.examples:scale", {"factor": 2.0})
    inputs = [np.arange(3, dtype=np.float32) + i for i in range(4)]

    def check(x: np.ndarray, y: np.ndarray) -> None:
        np.testing.assert_allclose(y, x * 2)

    done = asyncio.run(
        run_conformance(
            lambda: host.backend_for(f"local://?oversubscribe=1&cores={core}"),
            spec,
            inputs,
            bad_input="not a number",
            check_output=check,
        )
    )
    assert done == [
        "protocol",
        "deploy",
        "predict_batch",
        "errors",
        "scale",
        "named errors",
        "stats and remove",
        "close",
    ]

"""benchmarks/selection.py's live model-failure run really injects the failure and Exp4 reacts.

Before, the live run was 200 (``--quick``) or 1,000 queries while the failure started at query
5,000, so the live check never saw a failed model. The failure span now scales with the run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import selection as bench
from benchmarks._digits import digits_data
from inferline.adapters.local import LocalBackend

MODELS = ("nb", "logreg")


def test_quick_live_run_injects_the_failure_and_exp4_drops_the_failed_model() -> None:
    """Injected bugs caught: a fixed failure start past the run (the old 5,000 of a 200- or
    120-query run) -> nothing injected and no weight read at the span; the wrong-label
    replacement removed from the model call -> ``injected == 0`` and the weight never drops."""
    assert bench.live_span(200) == (50, 100) and bench.live_span(1000) == (250, 500)
    _, _, xte, yte = digits_data()
    specs = [bench._spec(k) for k in MODELS]

    async def main() -> dict:
        # one set of replicas for both, as the benchmark's section runs them (starting the
        # replica processes is most of this test's time)
        backend = LocalBackend(oversubscribe=True)
        try:
            preds = (await bench.served_predictions(specs, {"clean": xte}, backend))["clean"]
            fail = max(MODELS, key=lambda m: float(np.mean(preds[m] == yte)))
            args = argparse.Namespace(quick=True, seed=0, live_queries=120)
            live = await bench.live_failure(specs, preds, yte, fail, args, backend)
            assert [len(backend.replicas(m)) for m in MODELS] == [1, 1]  # left running
        finally:
            await backend.close()
        return {"fail": fail, **live}

    live = asyncio.run(main())
    a, b = live["span"]
    assert live["n"] == 120 and (a, b) == (30, 60)
    # Every call to the failed model inside the span answered a wrong label (the replacement
    # differs from the real answer unless the real one was already that wrong label).
    assert live["injected"] >= 0.8 * (b - a), live
    # Exp4 reacted: the failed (most accurate) model's weight fell sharply during the failure.
    assert live["fail_weight_start"] > 0.2, live
    assert live["fail_weight_end"] < 0.5 * live["fail_weight_start"], live
    assert live["agree"] > 0.9, live  # the served run matches the offline replay

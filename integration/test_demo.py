"""`inferline demo --quick`: the whole loop (trace, profile, serve, plan, apply, replay) on the
real digits pipeline, in its reduced mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


# time (~40 s): `inferline demo --quick` is the README's main job end to end (train the digits
# models, profile each on the bundled runtime, plan, serve, replay); its size is the point.
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "inferline", "demo", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"):
        assert step in r.stdout
    assert "P99 latency" in r.stdout and "SLO miss rate" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    ms = rep["measured"]
    assert ms["answered"] == ms["queries"] > 100
    assert ms["errors"] == 0
    assert rep["accuracy"] > 0.9  # real classifiers, trained at start-up
    assert rep["estimated"]["p99_ms"] > 0 and rep["cost_per_hour"] > 0
    # the estimate with profiles calibrated to the live server, within 10% or with the causes
    cal = rep["calibrated"]
    assert "calibrated estimate: measured P99" in r.stdout and cal["p99_ms"] > 0
    assert abs(cal["gap"]) <= 0.10 or cal["causes"], cal
    pipe = rep["pipeline"]
    assert pipe["edges"] == [["preprocess", "mlp"], ["mlp", "forest"]]
    assert 0 < pipe["scale_factors"]["forest"] < 0.5  # the conditional stage
    assert (out / "latency_cdf.png").stat().st_size > 10_000
    for f in ("profiles.json", "plan.json", "pipeline.json", "deployment.json"):
        assert (out / f).exists()

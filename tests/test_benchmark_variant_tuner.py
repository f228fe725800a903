"""The variant-tuner benchmark runs end to end (short cases) and prints its table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import variant_tuner


def test_quick_run_prints_the_table_and_the_variant_tuner_saves(capsys):
    argv = ["--quick", "--seeds", "0", "--pipelines", "image-processing"]
    assert variant_tuner.main(argv) == 0
    text = capsys.readouterr().out
    rows = [ln.split() for ln in text.splitlines() if ln.startswith("image-processing")]
    assert [r[1] for r in rows] == ["rate-tau10", "cv1to4"]
    for r in rows:
        plain_cost, var_cost, switches = float(r[4]), float(r[6]), int(r[8])
        assert switches >= 2  # to the cheap variant and back, at least
        assert var_cost < plain_cost
        assert 0.761 <= float(r[10]) < 0.783  # the mean accuracy lies between the variants'
    assert "2 runs: mean cost plain" in text and "reproduce: .venv/bin/python" in text


def test_cheap_share_counts_queries_from_activation_to_the_switch_backs_activation():
    arr = np.arange(0.0, 40.0, 1.0)  # one query a second
    switches = ((10.0, "resnet152", "resnet50"), (20.0, "resnet152", "resnet152"))
    # resnet50 serves from 15 to 25: 10 of 40 queries
    assert variant_tuner.cheap_share(arr, switches) == 0.25
    # never switched back: from 15 to the end
    assert variant_tuner.cheap_share(arr, switches[:1]) == 25 / 40
    assert variant_tuner.cheap_share(arr, ()) == 0.0

"""The tuner benchmark runs end to end (a short case) and prints its table and targets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import paper_tuner


def test_quick_case_prints_the_table_targets_and_bound(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--quick", "--seeds", "0", "--pipelines", "image-processing", "--no-real"]
    argv += ["--cases", "rate-tau60"]
    assert paper_tuner.main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "image-processing  rate-tau60" in text
    assert "targets for tuner over the paper's cases: miss <= 1%:" in text
    assert "targets for saving over the paper's cases" in text and "mean cost / oracle's:" in text
    assert "switches to the peak's ladder step" in text
    rows = json.loads(out.read_text())
    assert rows[0]["ladder_steps"] >= 1 and rows[0]["clairvoyant_miss"] is not None
    assert "the tuner started 20 s before the rise" in text
    # a tuner started late still follows the rise: it misses less than the plan alone
    late = rows[0]["from_plan_miss"]
    assert set(late) == {"tuner", "room", "saving"}
    assert all(0.0 <= m < rows[0]["results"]["plan"][0] for m in late.values())
    assert len(rows) == 1 and rows[0]["seed"] == 0
    res = rows[0]["results"]
    assert set(res) == set(paper_tuner.LABELS)
    # the plan alone cannot follow the rise; the tuner does, and under the replica-only cost
    assert res["plan"][0] > 0.2 and res["tuner"][0] < 0.01
    assert res["tuner"][1] < res["replicas"][1]

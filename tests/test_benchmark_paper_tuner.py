"""The tuner benchmark runs end to end (a short case) and prints its table and targets."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib
import io

import pytest

from benchmarks import paper_tuner

# the short case: one pipeline, one synthetic case, one seed (what --smoke runs)
ARGV = ["--quick", "--seeds", "0", "--pipelines", "image-processing", "--no-real"]
ARGV += ["--cases", "rate-tau60"]


# time (~15 s a run): the short case once, with the default activation of AutoScale's units,
# shared by the two tests that read it (each ran it before, the same run twice)
@pytest.fixture(scope="module")
def quick_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    """The short case's printed text and its rows (``--json``)."""
    out = tmp_path_factory.mktemp("paper_tuner") / "rows.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert paper_tuner.main([*ARGV, "--json", str(out)]) == 0
    return buf.getvalue(), json.loads(out.read_text())


def test_quick_case_prints_the_table_targets_and_bound(quick_case):
    text, rows = quick_case
    assert "image-processing  rate-tau60" in text
    assert "targets for tuner over the paper's cases: miss <= 1%:" in text
    assert "(reference) the oracle, whose cost is the bound: 10x below autoscale" in text
    assert "targets for saving over the paper's cases" in text and "mean cost / oracle's:" in text
    assert "switches to the peak's ladder step" in text
    assert rows[0]["ladder_steps"] >= 1 and rows[0]["clairvoyant_miss"] is not None
    assert "the tuner started 20 s before the rise" in text
    # a tuner started late still follows the rise: it misses less than the plan alone
    late = rows[0]["from_plan_miss"]
    assert set(late) == {"tuner", "room", "saving"}
    assert all(0.0 <= m < rows[0]["results"]["plan"][0] for m in late.values())
    assert len(rows) == 1 and rows[0]["seed"] == 0
    res = rows[0]["results"]
    assert set(res) == {*paper_tuner.LABELS, "basis=rate"}
    assert "targets for basis=rate over the paper's cases" in text and "mean over all:" in text
    # the plan alone cannot follow the rise; the tuner does, and under the replica-only cost
    assert res["plan"][0] > 0.2 and res["tuner"][0] < 0.01
    assert res["tuner"][1] < res["replicas"][1]


def test_tally_counts_cells_and_the_seed_means_of_each_case():
    """Cost against the oracle per cell and per case (the mean over its seeds): one seed 10%
    above the oracle and one 20% below is one cell out of two, and the case meets it."""

    def row(case, seed, tuner, oracle, miss=0.0):
        r = paper_tuner.Row("p", case, seed)
        r.results = {lab: (0.0, 1.0) for lab in paper_tuner.LABELS}
        r.results["tuner"] = (miss, tuner)
        r.results["oracle"] = (0.0, oracle)
        return r

    rows = [row("a", 0, 1.1, 1.0), row("a", 1, 0.8, 1.0), row("b", 0, 1.2, 1.0, miss=0.02)]
    text = paper_tuner.tally(rows, "tuner")
    assert "miss <= 1%: 2/3" in text
    assert "mean cost <= oracle: 1/3 (seed means per case: 1/2)" in text
    assert "mean cost / oracle's: 1.033" in text


def test_tally_reads_the_10x_target_per_cell_and_on_seed_means():
    """Case a: the baseline misses 1% on seed 0 only, the tuner 0.06% on both seeds: 10x below
    in the one cell where the baseline misses, but not on the means (0.06% vs 0.5%); pooled
    over the queries of that cell, 16.7x. Case b: the baseline never misses, so no reading
    counts it. A failure names query counts."""
    rows = []
    for case, seed, tuner, base in (("a", 0, 6e-4, 0.01), ("a", 1, 6e-4, 0.0), ("b", 0, 0.0, 0.0)):
        r = paper_tuner.Row("p", case, seed, queries=100_000)
        r.results = {lab: (base, 1.0) for lab in paper_tuner.LABELS}
        r.results["tuner"] = (tuner, 1.0)
        rows.append(r)
    text = paper_tuner.tally(rows, "tuner")
    assert "10x below autoscale where it misses: 1/1 (seed means per case: 0/1;" in text
    # pooled: the queries of the cells where the baseline misses (case a seed 0 only)
    assert "pooled over those cells: 0.060% against 1.000%, 16.7x" in text
    rows[0].results["tuner"] = (0.002, 1.0)
    problems = paper_tuner.check_targets(rows[:1])
    assert (
        "p/a (seed 0): tuner miss 0.200% (200 queries) not 10x below autoscale 1.000% "
        "(1000 queries)" in problems
    )


def test_tuner_flags_are_the_configs_fields_with_its_defaults_and_choices():
    """The flags come from TunerConfig: no flag gives the default config, each flag sets its
    field, and a value the field's type does not allow is refused by argparse."""
    from inferline.core import TunerConfig

    assert paper_tuner.parse_args([])[1] == TunerConfig()
    flags = "--stabilization-s 20 --down-rate window --headroom 0.3 --trigger room"
    _, cfg = paper_tuner.parse_args([*flags.split(), "--keep-horizon-s", "0"])
    assert (cfg.stabilization_delay_s, cfg.down_rate, cfg.headroom) == (20.0, "window", 0.3)
    assert (cfg.trigger, cfg.keep_horizon_s) == ("room", 0.0)
    assert paper_tuner.parse_args(["--settle-s", "off"])[1].settle_s is None
    assert paper_tuner.parse_args(["--settle-s", "2.5"])[1].settle_s == 2.5
    with pytest.raises(SystemExit):  # "curve" is an up_rate only (TunerConfig.down_rate's type)
        paper_tuner.parse_args(["--down-rate", "curve"])


# time (~15 s): one more run of the paper's tuner case (with the 30 s unit activation),
# compared with the shared run (AutoScale's units start in --activation-s, 5 s).
def test_unit_activation_changes_only_the_autoscale_columns(tmp_path, capsys, quick_case):
    """--unit-activation-s delays AutoScale's pipeline units only: the tuner's cells are the
    same, a unit that takes 30 s to start serves the rise later (more misses or more cost)."""
    # without the flag a unit starts as a replica does: 5 s, the paper's activation time
    assert paper_tuner.parse_args(ARGV)[0].unit_activation_s is None
    assert paper_tuner.ACTIVATION_S == 5.0
    rows = {"5": quick_case[1][0]["results"]}
    out = tmp_path / "u30.json"
    assert paper_tuner.main([*ARGV, "--unit-activation-s", "30", "--json", str(out)]) == 0
    rows["30"] = json.loads(out.read_text())[0]["results"]
    assert "(AutoScale's pipeline units 30 s)" in capsys.readouterr().out
    for label in ("tuner", "plan", "oracle", "replicas"):
        assert rows["5"][label] == rows["30"][label]
    for label in paper_tuner.BASELINES:
        assert rows["30"][label] != rows["5"][label]
        assert rows["30"][label][0] >= rows["5"][label][0]

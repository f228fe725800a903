"""``benchmarks/switching_live.py``'s start-up measurement and switching file (issue 47 target,
tasks 1, 3 and 4): interleaved rounds whose order rotates, each variant's median, and one
switching file (live table every 2 s over 5 s, spares by the common factor, dwell 0.5 s) that
``inferline serve`` accepts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for benchmarks.*

from benchmarks.switching_live import (
    LIVE_TABLE,
    TREES,
    median_of_rounds,
    round_orders,
    switching_file,
)
from inferline.deploy._switching_serve import load_switching


def test_rounds_rotate_so_every_variant_takes_every_place():
    orders = round_orders(["f200", "f100", "f30"], 3)
    assert orders == [["f200", "f100", "f30"], ["f100", "f30", "f200"], ["f30", "f200", "f100"]]
    for place in range(3):
        assert {o[place] for o in orders} == {"f200", "f100", "f30"}
    assert round_orders(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_median_outvotes_one_round_under_a_passing_load():
    # f200's first round ran while another job loaded the machine (as measured: 24.6 vs 50 ms)
    got = median_of_rounds({"f200": [0.110, 0.050, 0.048], "f30": [0.011, 0.012, 0.030]})
    assert got == {"f200": 0.050, "f30": 0.012}


def test_the_benchmarks_switching_file_loads_with_its_live_table_settings(tmp_path):
    acc = {"f200": 0.82, "f100": 0.80, "f30": 0.74}
    lat = {"f200": 0.050, "f100": 0.030, "f30": 0.012}
    cfg = load_switching(switching_file(tmp_path, list(TREES), acc, lat))
    rb = cfg.rebuild_config()
    assert (rb.every_s, rb.window_s, rb.min_batches, rb.unobserved) == (2.0, 5.0, 10, "common")
    assert cfg.min_dwell_s == LIVE_TABLE["min_dwell_s"] == 0.5
    # one setting for every run: a one-variant file carries the same live-table fields
    one = load_switching(switching_file(tmp_path, ["f30"], acc, lat))
    assert one.rebuild_config() == rb and one.min_dwell_s == cfg.min_dwell_s

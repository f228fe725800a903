"""Model-Switching's live table (issue 47 item 2) and measured accuracy (item 3): the pure rebuild
policy with an injected clock, the profiles it scales, the keeper that swaps the controller's
table, and each variant's accuracy scored on a held-out set through a real dispatcher and real
replica processes (two digits classifiers)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for benchmarks._digits

from inferline.core import ModelSpec, Profiles, ValidationError
from inferline.deploy._switching_serve import ServeSwitching, load_switching
from inferline.deploy._switching_table import TableKeeper, load_held_out, score_held_out
from inferline.queueing import ArrivalEvent, BatchEvent
from inferline.selection import (
    SwitchingConfig,
    SwitchingController,
    TableRebuildConfig,
    TableRebuildPolicy,
    Variant,
    VariantTiming,
    build_switching_table,
    scaled_profiles,
    timings_by_batch,
)

BASE = Profiles.from_latencies(
    {
        "big": {"cpu": {1: 0.030, 4: 0.040}, "cpu-t2": {1: 0.018, 4: 0.024}},
        "small": {"cpu": {1: 0.004, 4: 0.006}},
    }
)
HW = {"big": "cpu", "small": "cpu"}
VARIANTS = (Variant("big", 0.97), Variant("small", 0.85))
CFG = SwitchingConfig(
    deadline_s=0.1, core_budget=2, rates_qps=(5, 20, 40, 80), sim_queries=300, max_batch_size=4
)


def live(big_s: float, n: int = 12) -> dict[str, dict[int, VariantTiming]]:
    return {"big": {1: VariantTiming(n, big_s)}, "small": {1: VariantTiming(n, 0.004)}}


def test_policy_waits_for_its_period_and_a_real_change():
    p = TableRebuildPolicy(TableRebuildConfig(every_s=10, min_batches=10, threshold=0.1), BASE)
    # twice as slow as profiled, but the table is 5 s old: not yet
    assert p.decide(5.0, 0.0, {}, live(0.060), HW, 10.0, 80.0) is None
    d = p.decide(10.0, 0.0, {}, live(0.060), HW, 10.0, 80.0)
    assert d is not None and d.factors["big"] == pytest.approx(2.0)
    assert "big service x1.00 -> x2.00 (12 batches on cpu)" in d.changes
    assert "small" not in d.changes  # as profiled: no change to report
    # built with x2: 5% more is within the threshold; too few batches do not count
    assert p.decide(30.0, 10.0, d.factors, live(0.063), HW, 10.0, 80.0) is None
    assert p.decide(30.0, 10.0, d.factors, live(0.030, n=9), HW, 10.0, 80.0) is None
    back = p.decide(30.0, 10.0, d.factors, live(0.030), HW, 10.0, 80.0)
    assert back is not None and back.factors["big"] == pytest.approx(1.0)
    # a rate above the grid's top is a reason of its own
    up = p.decide(30.0, 10.0, d.factors, live(0.060), HW, 120.0, 80.0)
    assert up is not None and "rate 120.0 q/s above the grid's 80.0" in up.changes
    off = TableRebuildPolicy(TableRebuildConfig(every_s=0), BASE)
    assert off.decide(1e9, 0.0, {}, live(0.3), HW, 1e3, 1.0) is None


def test_factor_weighs_batch_sizes_by_count_and_clamps_to_the_profiled_sizes():
    p = TableRebuildPolicy(TableRebuildConfig(min_batches=1), BASE)
    by = {1: VariantTiming(3, 0.060), 4: VariantTiming(1, 0.040), 8: VariantTiming(0, 1.0)}
    # three batches at x2, one at x1 -> 2 ** 0.75
    assert p.factor("big", "cpu", by) == pytest.approx(2**0.75)
    assert p.factor("big", "gpu", by) is None
    assert timings_by_batch([("a", 1, 0.3), ("a", 1, 0.1), ("a", 2, 0.5)]) == {
        "a": {1: VariantTiming(2, 0.2), 2: VariantTiming(1, 0.5)}
    }


def test_scaled_profiles_scale_every_split_of_the_variant_only():
    s = scaled_profiles(BASE, {"big": 2.0})
    assert s.latency("big", "cpu", 4) == pytest.approx(0.080)
    assert s.latency("big", "cpu-t2", 1) == pytest.approx(0.036)
    assert s.latency("small", "cpu", 1) == pytest.approx(0.004)


def test_config_errors_name_the_switching_field():
    with pytest.raises(ValidationError, match=r"switching\.rebuild_s"):
        TableRebuildConfig(every_s=-1)
    with pytest.raises(ValidationError, match=r"switching\.rebuild_min_batches"):
        ServeSwitching("a", "big", VARIANTS, "p.json", rebuild_min_batches=0)


class FakeSwitcher:
    """Fake of ``LiveSwitcher``'s state the keeper reads and replaces (no replicas needed)."""

    def __init__(self) -> None:
        self.config = CFG
        self.table = build_switching_table(VARIANTS, BASE, CFG)
        self.controller = SwitchingController(self.table, CFG)
        self._threads = {"big": 1, "small": 1}
        self.stage = "big"
        self.active = None


def test_keeper_rebuilds_from_the_window_and_says_so():
    now = [100.0]
    sw = FakeSwitcher()
    policy = TableRebuildPolicy(TableRebuildConfig(every_s=5, min_batches=5), BASE)
    source = {"big": "declared", "small": "declared"}
    k = TableKeeper(
        sw, policy, VARIANTS, source, app="digits", window_s=lambda: 10.0, clock=lambda: now[0]
    )
    startup = sw.table
    for i in range(8):  # big runs 3x slower than profiled; 8 arrivals in the window
        k.on_event(BatchEvent("big", "r0", 1, 96.0 + i * 0.5, 0.090, (0.0,), True))
        k.on_event(ArrivalEvent("big", 97.0 + i * 0.5, True, 0))
    k.on_event(BatchEvent("big", "r0", 1, 80.0, 9.0, (0.0,), True))  # outside the window
    k.on_event(BatchEvent("other", "r0", 1, 99.0, 9.0, (0.0,), True))  # not a variant
    assert asyncio.run(k.tick()) is None  # built at 100: not due
    now[0] = 106.0
    info = asyncio.run(k.tick())
    assert info is not None and info.source == "live" and info.builds == 2
    assert info.factors["big"] == pytest.approx(3.0)
    assert info.rate_qps == pytest.approx(0.8)  # 8 arrivals in the 10 s window
    assert sw.table is not startup and sw.controller.table is sw.table
    assert 0.8 in sw.table.rates_qps  # the measured rate has its own column
    # three times slower: the big variant meets the deadline less often at 40 q/s
    j = sw.table.rates_qps.index(40.0)
    big_rows = [i for i, o in enumerate(sw.table.options) if o.variant == "big"]
    assert max(sw.table.meet[i][j] for i in big_rows) < max(startup.meet[i][j] for i in big_rows)
    snap = json.loads(json.dumps(k.snapshot(), default=str))
    assert snap["built"]["source"] == "live" and snap["rebuilds"][0]["source"] == "startup"
    assert snap["accuracy"]["big"] == {"value": 0.97, "source": "declared"}
    assert snap["window"]["timings"]["big"]["1"]["batches"] == 8


def test_held_out_file_is_read_without_pickle_and_resolved_beside_the_file(tmp_path):
    np.savez(tmp_path / "h.npz", x=np.zeros((3, 4), np.float32), y=np.array([1, 2, 3]))
    xs, ys = load_held_out(tmp_path / "h.npz")
    assert len(xs) == 3 and ys == [1, 2, 3]
    (tmp_path / "bad.json").write_text(json.dumps({"inputs": [[0], [1]], "labels": [1]}))
    with pytest.raises(ValidationError, match=r"switching\.held_out"):
        load_held_out(tmp_path / "bad.json")
    (tmp_path / "p.json").write_text(json.dumps(BASE.to_dict()))
    doc = ServeSwitching("a", "big", VARIANTS, "p.json", held_out="h.npz").to_dict()
    (tmp_path / "sw.json").write_text(json.dumps(doc))
    cfg = load_switching(tmp_path / "sw.json")
    assert cfg.held_out == str(tmp_path / "h.npz")
    assert ServeSwitching.from_dict(cfg.to_dict()) == cfg
    doc["held_out"] = "bad.json"
    (tmp_path / "sw.json").write_text(json.dumps(doc))
    with pytest.raises(ValidationError, match=r"switching\.held_out"):
        load_switching(tmp_path / "sw.json")


# time (~3-5 s): two real classifiers trained in their replica processes
def test_accuracy_is_scored_through_the_dispatcher_on_real_replicas():
    from benchmarks._digits import SOURCE, digits_data, fit_classifier
    from inferline.adapters.local import LocalBackend
    from inferline.core import ModelConfig
    from inferline.queueing import Dispatcher

    _, _, xte, yte = digits_data()
    xs, ys = list(xte[:60]), [int(y) for y in yte[:60]]
    want = {
        k: float(np.mean(fit_classifier(k).predict(xte[:60] / 16.0) == yte[:60]))
        for k in ("nb", "knn")
    }

    async def main() -> dict[str, float]:
        backend = LocalBackend(oversubscribe=True)
        dispatcher = Dispatcher()
        try:
            cfg = ModelConfig("cpu", 4, 0)  # no replicas: scoring starts one
            await asyncio.gather(
                *(backend.deploy(ModelSpec(k, SOURCE, {"kind": k}), cfg) for k in want)
            )
            for k in want:
                dispatcher.add_model(k)
            dispatcher.attach(backend)
            return await score_held_out(dispatcher, backend, list(want), xs, ys)
        finally:
            await dispatcher.close()
            await backend.close()

    got = asyncio.run(main())
    assert got == pytest.approx(want)  # the replicas' answers, scored here, match the fits
    assert got["knn"] > got["nb"]

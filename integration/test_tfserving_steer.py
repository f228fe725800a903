"""TF Serving steered through its own batcher (issue 43 item 3), against the STAND-IN (which
follows the real server's rules: ``--enable_per_model_batching_parameters``, a version's
``batching_params.pbtxt`` read when it loads, TF Serving's batch scheduler, its Prometheus
names); the stand-in's batch log and ``cost.json`` are STAND-IN ONLY, so the test runs only
against it.

``apply_server_batcher`` adds a version directory with the plan's parameters and reloads in
two steps: requests sent all through the switch are all served. The stand-in's batcher then
honours each setting: a full queue refuses at once (UNAVAILABLE / 503), a batch waits for its
first request's timeout unless full, it is padded to the next allowed size and costs that,
and more instances (batch threads) run batches at once. ``server_counters`` reads the
server's counters, which agree with what the clients saw. ``restore_snapshot`` (the path of
``inferline detach``) and ``restore_operator_settings`` put the operator's version, entry and
batching parameters back and remove inferline's directories.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from tfserving_standin import TFServer, server_kind
from tfserving_standin._models import save_dense_model

from inferline.adapters.tfserving import (
    TFServingBackend,
    grpc_available,
    parse_batching_text,
    parse_text,
    restore_snapshot,
)
from inferline.core import TFServingBatcher

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not grpc_available(), reason="model management needs tensorflow-serving-api"
    ),
    pytest.mark.skipif(
        server_kind() == "real", reason="reads the STAND-IN-only batch log and cost.json"
    ),
]

OPERATOR_BATCHING = "max_batch_size { value: 8 }\nnum_batch_threads { value: 2 }\n"
CONFIG = """\
# the operator's file
model_config_list {{
  config {{ name: "m" base_path: "{root}" model_platform: "tensorflow" }}
}}
"""
FLAGS = ["--enable_batching", "--enable_per_model_batching_parameters"]
COST = {"base_ms": 400, "per_row_ms": 25}  # a batch of b rows runs 400 + 25 b ms
WAIT_US = 500_000  # wide: requests sent at once reach a busy 2-core machine's server spread
WAIT = WAIT_US / 1e6


def _model(root: Path) -> None:
    rng = np.random.default_rng(0)
    save_dense_model(root, 1, [(rng.normal(size=(4, 3)), np.zeros(3))])
    (root / "1" / "cost.json").write_text(json.dumps(COST))
    (root / "1" / "batching_params.pbtxt").write_text(OPERATOR_BATCHING)


class Client:
    """Plain REST calls straight at the server, as the operator's clients make them."""

    def __init__(self, rest: str) -> None:
        self.rest = rest
        self.ok = 0
        self.refused = 0
        self._lock = threading.Lock()

    def post(self) -> int:
        r = requests.post(
            f"http://{self.rest}/v1/models/m:predict",
            json={"instances": [[0.1, 0.2, 0.3, 0.4]]},
            timeout=30,
        )
        with self._lock:
            self.ok += r.status_code == 200
            self.refused += r.status_code == 503
        return r.status_code

    def spread(self, n: int, gap_s: float) -> list[int]:
        """``n`` requests at once, each ``gap_s`` after the previous."""
        with ThreadPoolExecutor(n) as pool:
            futs = []
            for _ in range(n):
                futs.append(pool.submit(self.post))
                time.sleep(gap_s)
            return sorted(f.result() for f in futs)

    def batches(self, since: int = 0) -> list[dict[str, Any]]:
        r = requests.get(f"http://{self.rest}/standin/batches?model=m", timeout=10)
        return r.json()["batches"][since:]

    def served_versions(self) -> list[int]:
        st = requests.get(f"http://{self.rest}/v1/models/m", timeout=10).json()
        return [int(s["version"]) for s in st["model_version_status"] if s["state"] == "AVAILABLE"]


def _show(batches: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The batches as (version, rows, queue entries and start after the first entry)."""
    return [
        (
            b["version"],
            b["rows"],
            [round(e - b["entered"][0], 3) for e in b["entered"]],
            round(b["start"] - b["entered"][0], 3),
        )
        for b in batches
    ]


async def _apply_under_load(be: TFServingBackend, c: Client, root: Path) -> None:
    """The first steer: a full queue refuses. Requests sent all through the switch are
    all answered."""
    stop = threading.Event()
    seen: list[int] = []
    bg = threading.Thread(target=lambda: [seen.append(c.post()) for _ in iter(stop.is_set, True)])
    bg.start()
    try:
        await be.apply_server_batcher("m", TFServingBatcher(2, 0, 1, 2).to_dict(), 1)
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.to_thread(bg.join)
    assert seen and set(seen) == {200}, seen
    assert sorted(p.name for p in root.iterdir()) == ["1", "2"]
    assert c.served_versions() == [2]
    got = parse_batching_text((root / "2" / "batching_params.pbtxt").read_text())
    assert got == {
        "max_batch_size": 2,
        "batch_timeout_micros": 0,
        "num_batch_threads": 1,
        "max_enqueued_batches": 2,
        "allowed_batch_sizes": [],
    }
    assert (root / "1" / "batching_params.pbtxt").read_text() == OPERATOR_BATCHING
    # one thread, no timeout: 1 runs alone, 2+3 and 4+5 fill the two batches the queue may
    # hold, 6 and 7 find it full and are refused at once (all sent within 1's run)
    mark = len(c.batches())
    assert c.spread(7, 0.04) == [200] * 5 + [503] * 2
    assert [(b["version"], b["rows"]) for b in c.batches(mark)] == [(2, 1), (2, 2), (2, 2)]


async def _timeout_and_padding(be: TFServingBackend, c: Client, root: Path) -> None:
    """Max 4, 500 ms from the first request, padded to 2 or 4."""
    await be.apply_server_batcher("m", TFServingBatcher(4, WAIT_US, 1, 10, (2, 4)).to_dict(), 1)
    assert sorted(p.name for p in root.iterdir()) == ["1", "3"]  # inferline's 2 retired
    mark = len(c.batches())
    assert c.spread(1, 0) == [200]
    assert c.spread(3, 0.1) == [200] * 3
    assert c.spread(4, 0) == [200] * 4
    got = c.batches(mark)
    assert len(got) == 3, _show(got)
    alone, three, full = got
    assert (alone["version"], alone["rows"], alone["padded"]) == (3, 1, 2)
    assert alone["start"] - alone["first_entered"] >= WAIT - 1e-3
    padded_cost = (COST["base_ms"] + COST["per_row_ms"] * 2) / 1e3
    assert alone["end"] - alone["start"] >= padded_cost - 1e-3  # padded rows cost too
    assert (three["rows"], three["padded"]) == (3, 4)
    assert three["start"] - three["entered"][0] >= WAIT - 1e-3  # counted from the first
    assert three["start"] - three["entered"][-1] < WAIT
    assert (full["rows"], full["padded"]) == (4, 4)
    assert full["start"] - full["first_entered"] < WAIT  # a full batch goes at once


async def _more_instances(be: TFServingBackend, c: Client, root: Path) -> None:
    """Two instances: two batch threads, two batches at once."""
    doc = TFServingBatcher(4, WAIT_US, 1, 10, (2, 4)).to_dict()
    await be.apply_server_batcher("m", doc, 2)
    assert sorted(p.name for p in root.iterdir()) == ["1", "4"]
    assert (
        parse_batching_text((root / "4" / "batching_params.pbtxt").read_text())["num_batch_threads"]
        == 2
    )
    await be.apply_server_batcher("m", doc, 2)  # already served so: nothing changes
    assert sorted(p.name for p in root.iterdir()) == ["1", "4"]
    mark = len(c.batches())
    assert c.spread(8, 0) == [200] * 8
    got = c.batches(mark)
    assert len(got) == 2, _show(got)
    a, b = got
    assert (a["rows"], b["rows"]) == (4, 4) and max(a["start"], b["start"]) < min(
        a["end"], b["end"]
    )


def _check_restored(c: Client, root: Path, config: str) -> None:
    assert sorted(p.name for p in root.iterdir()) == ["1"]
    assert (root / "1" / "batching_params.pbtxt").read_text() == OPERATOR_BATCHING
    assert c.served_versions() == [1]
    text = requests.get(f"http://{c.rest}/standin/model_config", timeout=10).json()
    assert parse_text(text["model_config"]) == parse_text(config)
    mark = len(c.batches())
    assert c.spread(3, 0) == [200] * 3
    assert {b["version"] for b in c.batches(mark)} == {1}


def test_steered_tfserving_batcher_honoured_and_restored_standin(tmp_path: Path) -> None:
    root = tmp_path / "models" / "m"
    _model(root)
    mon = tmp_path / "monitoring.config"
    mon.write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    config = CONFIG.format(root=root)
    with TFServer(
        tmp_path, config_text=config, flags=[*FLAGS, f"--monitoring_config_file={mon}"]
    ) as srv:
        c = Client(srv.rest)
        url = f"tfserving://{srv.rest}"

        async def scenario() -> None:
            be = TFServingBackend(
                url, grpc_port=srv.grpc_port, model_config_file=str(srv.config_file)
            )
            snap = be.operator_snapshot()
            try:
                await _apply_under_load(be, c, root)
                await _timeout_and_padding(be, c, root)
                await _more_instances(be, c, root)
                counters = (await be.server_counters(["m", "m"]))["m"]  # app = model
            finally:
                await be.close()  # as a crash: nothing restored
            assert counters["request_success"] == c.ok and counters["request_failure"] == 2
            assert counters["exec_count"] == len(c.batches())
            assert min(counters[k] for k in ("queue_us", "compute_us", "request_us")) > 0
            done = await restore_snapshot(url, snap)
            assert str(root / "4") in done["removed versions"]
            _check_restored(c, root, config)
            be = TFServingBackend(
                url, grpc_port=srv.grpc_port, model_config_file=str(srv.config_file)
            )
            try:
                await be.apply_server_batcher("m", TFServingBatcher(2).to_dict(), 1)
                assert c.served_versions() == [2]
                await be.restore_operator_settings()  # attach stopping: SIGTERM, detach
            finally:
                await be.close()
            _check_restored(c, root, config)

        asyncio.run(scenario())

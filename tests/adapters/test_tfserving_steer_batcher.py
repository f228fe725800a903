"""The TF Serving STAND-IN's batch scheduler (integration/tfserving_standin/_batching.py,
``BatchQueue``: pure, clock passed in) agrees exactly with the estimator's ``TFServingBatcher``
rules on the same arrivals: per-query latencies and the refused queries, with padding to
allowed sizes, a full queue, several batch threads and the timeout counted from a batch's
first request. Driven here by a small event loop with the profile's latency of the padded
size as each batch's run time."""

from __future__ import annotations

import heapq
import sys
from pathlib import Path

import numpy as np
import pytest

from inferline.core import EstimatorOptions, ModelConfig, Pipeline, Profiles, simulate
from inferline.core.estimator import TFServingBatcher

# the stand-in lives beside the integration tests, not in the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from tfserving_standin._batching import (
    BatchingParams,
    BatchQueue,
    Refused,
    Task,
)

GRID = 64.0  # times on a 2^-6 s grid make coinciding events exact
US = 15625  # 1/64 s in microseconds
ONE = Pipeline.linear("one", ["a"])
MAXB = 16
PROF = Profiles.from_latencies({"a": {"cpu": {b: (4 + 2 * b) / GRID for b in range(1, MAXB + 1)}}})


def _params(b: TFServingBatcher) -> BatchingParams:
    return BatchingParams(
        b.max_batch_size,
        b.batch_timeout_micros,
        b.num_batch_threads,
        b.max_enqueued_batches,
        b.allowed_batch_sizes,
    )


def _drive(b: TFServingBatcher, arr: np.ndarray) -> tuple[np.ndarray, set[int], list[int]]:
    """The stand-in's queue on ``arr``: latencies (inf: refused), the refused queries and
    the padded size of every batch, in start order. As the estimator, the arrivals and
    completions of an instant are applied before a batch is taken."""
    q = BatchQueue(_params(b))
    lat = np.full(len(arr), np.inf)
    refused: set[int] = set()
    padded_sizes: list[int] = []
    ids: dict[int, int] = {}
    running: list[tuple[float, int, list[Task]]] = []  # (end, seq, tasks)
    i, seq, now = 0, 0, 0.0
    while i < len(arr) or running or not q.idle():
        nxt = [arr[i]] if i < len(arr) else []
        nxt += [running[0][0]] if running else []
        due = q.due()
        if due is not None and q.running < b.num_batch_threads:
            nxt.append(max(due, now))
        now = min(nxt)
        while running and running[0][0] <= now:
            _, _, tasks = heapq.heappop(running)
            q.finished()
            for t in tasks:
                lat[ids[id(t)]] = now - arr[ids[id(t)]]
        while i < len(arr) and arr[i] <= now:
            t = Task(1, now)
            ids[id(t)] = i
            try:
                q.offer(t, now)
            except Refused:
                refused.add(i)
            i += 1
        while (got := q.take(now)) is not None:
            tasks, _, padded = got
            padded_sizes.append(padded)
            seq += 1
            heapq.heappush(running, (now + PROF.latency("a", "cpu", padded), seq, tasks))
    return lat, refused, padded_sizes


def _arrivals(rate: float, n: int, seed: int) -> np.ndarray:
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    return np.round(np.cumsum(gaps) * GRID) / GRID


CASES = {
    "padding to allowed sizes": (TFServingBatcher(16, 2 * US, 2, 50, (2, 4, 8, 16)), 35.0),
    "full queue refuses": (TFServingBatcher(4, 1 * US, 1, 2, (2, 4)), 40.0),
    "several batch threads": (TFServingBatcher(8, 3 * US, 3, 6), 50.0),
    "timeout from the first request": (TFServingBatcher(8, 5 * US, 1, 4, (4, 8)), 12.0),
    "no timeout": (TFServingBatcher(4, 0, 2, 3), 45.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stand_in_queue_agrees_with_the_estimator(name: str) -> None:
    b, rate = CASES[name]
    arr = _arrivals(rate, 600, seed=len(name))
    opt = EstimatorOptions(server_batchers={"a": b})
    cfg = {"a": ModelConfig("cpu", b.max_batch_size, b.num_batch_threads)}
    est = simulate(ONE, cfg, PROF, arr, options=opt)
    lat, refused, padded = _drive(b, arr)
    assert set(np.flatnonzero(est.refused).tolist()) == refused
    np.testing.assert_array_equal(np.isinf(est.latencies_s), np.isinf(lat))
    fin = np.isfinite(lat)
    np.testing.assert_allclose(est.latencies_s[fin], lat[fin], rtol=0, atol=1e-9)
    assert all(p in (b.allowed_batch_sizes or range(1, b.max_batch_size + 1)) for p in padded)
    if name == "full queue refuses":
        assert refused  # the case exercises the rule it names
    if b.allowed_batch_sizes:
        assert any(p > 1 for p in padded)


def test_queue_rules_by_hand() -> None:
    p = BatchingParams(4, 100_000, 1, 2, (2, 4))
    q = BatchQueue(p)
    a = [Task(1, 0.0) for _ in range(10)]
    q.offer(a[0], 0.0)
    assert q.take(0.05) is None and q.due() == pytest.approx(0.1)  # from the FIRST request
    q.offer(a[1], 0.08)
    assert q.take(0.099) is None
    tasks, rows, padded = q.take(0.1)  # type: ignore[misc]
    assert (tasks, rows, padded) == ([a[0], a[1]], 2, 2)
    assert q.take(0.1) is None  # the one thread is busy
    for k in range(2, 6):  # 4 rows: the open batch is full...
        q.offer(a[k], 0.2)
    q.offer(a[6], 0.21)  # ...a fifth closes it and opens a second
    with pytest.raises(Refused):  # 3 rows more do not fit: no third batch may be enqueued
        q.offer(Task(4, 0.22), 0.22)
    with pytest.raises(ValueError, match="larger than maximum"):
        q.offer(Task(5, 0.22), 0.22)
    q.finished()
    tasks, rows, padded = q.take(0.22)  # type: ignore[misc]
    assert (rows, padded) == (4, 4)  # the closed batch goes first, at once
    q.finished()
    assert q.take(0.25) is None  # the open one waits for its first request's timeout
    tasks, rows, padded = q.take(0.31)  # type: ignore[misc]
    assert (tasks, rows, padded) == ([a[6]], 1, 2)  # padded to the next allowed size


def test_params_from_text_fields_and_checks() -> None:
    from inferline.adapters.tfserving import parse_batching_text

    text = (
        "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 500 }\n"
        "allowed_batch_sizes: 4\nallowed_batch_sizes: 8\npad_variable_length_inputs: true\n"
    )
    base = BatchingParams(num_batch_threads=3)
    got = BatchingParams.from_fields(parse_batching_text(text), base)
    assert got == BatchingParams(8, 500, 3, 10, (4, 8))
    assert got.padded(3) == 4 and got.padded(5) == 8
    with pytest.raises(ValueError, match="allowed_batch_sizes"):
        BatchingParams.from_fields({"max_batch_size": 8, "allowed_batch_sizes": [4, 6]})

"""STAND-IN batching: TF Serving's batch scheduler for one model version (not TF Serving's code).

Rules (BACKENDS.md "The servers' own batchers"; TF Serving ``batching/README.md`` and
``SharedBatchScheduler``), the same the estimator's ``TFServingBatcher`` simulates:

* a request (a task of its row count) joins the open batch; one that does not fit (the open
  batch would pass ``max_batch_size``) closes it and opens a new one, unless the queue already
  holds ``max_enqueued_batches`` batches (closed and open): then it is refused at once
  (UNAVAILABLE, "The batch scheduling queue ... is full"); a task larger than
  ``max_batch_size`` is INVALID_ARGUMENT;
* a closed batch is schedulable at once, the open one when full or when its FIRST task has
  waited ``batch_timeout_micros``; a schedulable batch starts when one of
  ``num_batch_threads`` is free (front first);
* a batch is padded to the smallest of ``allowed_batch_sizes`` it fits (the model runs on the
  padded batch; the padding rows are copies of its first row and their outputs dropped).

:class:`BatchQueue` holds the decisions, pure and with the clock passed in (``now``), so a
unit test drives it on the same arrivals as the estimator; :class:`Batcher` runs it with real
threads: a scheduler thread that sleeps until a batch is schedulable, and a pool of
``num_batch_threads`` threads that run the batches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BatchQueue", "Batcher", "BatchingParams", "Refused", "Task"]

log = logging.getLogger("tfserving-standin")


@dataclass(frozen=True)
class BatchingParams:
    """A version's batching parameters, TF Serving's defaults where a field is unset
    (``BasicBatchScheduler::Options``: max batch 1000, no timeout, 10 enqueued batches, one
    thread per CPU)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    num_batch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_enqueued_batches: int = 10
    allowed_batch_sizes: tuple[int, ...] = ()

    @classmethod
    def from_fields(cls, d: dict[str, Any], base: BatchingParams | None = None) -> BatchingParams:
        """``d`` (``parse_batching_text``'s fields) over ``base`` (default: TF Serving's)."""
        b = base or cls()
        allowed = tuple(d.get("allowed_batch_sizes") or b.allowed_batch_sizes)
        out = cls(
            int(d.get("max_batch_size", b.max_batch_size)),
            int(d.get("batch_timeout_micros", b.batch_timeout_micros)),
            int(d.get("num_batch_threads", b.num_batch_threads)),
            int(d.get("max_enqueued_batches", b.max_enqueued_batches)),
            allowed,
        )
        if min(out.max_batch_size, out.num_batch_threads, out.max_enqueued_batches) < 1:
            raise ValueError(f"batching parameters must be positive: {out}")
        if allowed and (list(allowed) != sorted(set(allowed)) or allowed[-1] != out.max_batch_size):
            # TF Serving refuses to load such a version (batching_session.cc)
            raise ValueError(
                "allowed_batch_sizes must be increasing and end with max_batch_size: "
                f"{list(allowed)} vs {out.max_batch_size}"
            )
        return out

    def padded(self, n: int) -> int:
        return next((a for a in self.allowed_batch_sizes if a >= n), n)


class Refused(Exception):
    """The queue is full: TF Serving answers UNAVAILABLE at once."""


@dataclass
class Task:
    """One request: its rows, when it entered the queue, and (for the threaded batcher) its
    inputs and where its answer goes."""

    size: int
    entered: float
    inputs: dict[str, np.ndarray] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


class BatchQueue:
    """The scheduler's queue of one model version: pure decisions, the clock passed in."""

    def __init__(self, params: BatchingParams) -> None:
        self.params = params
        self.batches: deque[list[Task]] = deque([[]])  # the last one is open
        self.rows: deque[int] = deque([0])
        self.open_since = 0.0  # when the open batch's first task joined it
        self.running = 0  # batches on batch threads
        self.closing = False  # draining for unload: the open batch goes without waiting

    def offer(self, task: Task, now: float) -> None:
        """Enqueue ``task``; ``Refused`` when the queue is full, ``ValueError`` when the
        task is larger than a batch may be."""
        p = self.params
        if task.size > p.max_batch_size:
            raise ValueError(
                f"Task size {task.size} is larger than maximum input batch size {p.max_batch_size}"
            )
        if self.rows[-1] + task.size > p.max_batch_size:
            if len(self.batches) >= p.max_enqueued_batches:
                raise Refused("The batch scheduling queue to which this task was submitted is full")
            self.batches.append([])
            self.rows.append(0)
        if not self.batches[-1]:
            self.open_since = now
        self.batches[-1].append(task)
        self.rows[-1] += task.size

    def due(self) -> float | None:
        """When the open batch becomes schedulable by its timeout (None: no open batch
        waits on one)."""
        if len(self.batches) > 1 or not self.batches[0]:
            return None
        return self.open_since + self.params.batch_timeout_micros / 1e6

    def take(self, now: float) -> tuple[list[Task], int, int] | None:
        """The next batch to run now, as (tasks, rows, padded rows), and a batch thread
        taken for it; None when no batch is schedulable or no thread is free."""
        p = self.params
        if self.running >= p.num_batch_threads:
            return None
        if len(self.batches) > 1:
            tasks, rows = self.batches.popleft(), self.rows.popleft()
        elif self.batches[0] and (
            self.closing or self.rows[0] >= p.max_batch_size or now >= self.due()  # type: ignore[operator]
        ):
            tasks, rows = self.batches[0], self.rows[0]
            self.batches[0], self.rows[0] = [], 0
        else:
            return None
        self.running += 1
        return tasks, rows, p.padded(rows)

    def finished(self) -> None:
        """A batch thread is free again."""
        self.running -= 1

    def idle(self) -> bool:
        return self.running == 0 and not self.batches[0] and len(self.batches) == 1


# what a batch run reports: (tasks, rows, padded rows, queue entry of its first task, start, end)
BatchRecord = tuple[list[Task], int, int, float, float, float]


class Batcher:
    """:class:`BatchQueue` with real threads. ``run(inputs)`` runs the model on one padded
    batch; ``on_batch`` is told of every batch run (metrics, the batch log)."""

    def __init__(
        self,
        params: BatchingParams,
        run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
        on_batch: Callable[[BatchRecord], None] = lambda r: None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        self.params = params
        self._run = run
        self._on_batch = on_batch
        self._clock = clock
        self._q = BatchQueue(params)
        self._cv = threading.Condition()
        self._stopped = False  # the scheduler ended (unloaded): late requests run unbatched
        self._pool = ThreadPoolExecutor(
            params.num_batch_threads, thread_name_prefix=f"batch-{name}"
        )
        self._thread = threading.Thread(target=self._schedule, name=f"sched-{name}", daemon=True)
        self._thread.start()

    def submit(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one request through the batcher and wait for its outputs (``Refused``,
        ``ValueError`` or the model's own error otherwise)."""
        rows = {int(np.shape(a)[0]) if np.ndim(a) else 1 for a in inputs.values()}
        if len(rows) != 1:
            raise ValueError("Batching Run() input tensors must have equal 0th-dimension size")
        task = Task(rows.pop(), 0.0, inputs)
        with self._cv:
            stopped = self._stopped
            if not stopped:
                task.entered = self._clock()
                self._q.offer(task, task.entered)
                self._cv.notify()
        if stopped:  # a request that found this version just before it unloaded: run it
            return self._run(inputs)
        task.done.wait()
        if task.error is not None:
            raise task.error
        assert task.result is not None
        return task.result

    def _schedule(self) -> None:
        with self._cv:
            while True:
                got = self._q.take(self._clock())
                if got is not None:
                    self._pool.submit(self._run_batch, *got)
                    continue
                if self._q.closing and self._q.idle():
                    self._stopped = True
                    return
                # all threads busy: a finishing batch wakes us, not the open batch's timeout
                busy = self._q.running >= self.params.num_batch_threads
                due = None if busy else self._q.due()
                self._cv.wait(None if due is None else max(0.0, due - self._clock()))

    def _run_batch(self, tasks: list[Task], rows: int, padded: int) -> None:
        start = self._clock()
        try:
            names = list(tasks[0].inputs or {})
            merged = {k: np.concatenate([t.inputs[k] for t in tasks]) for k in names}  # type: ignore[index]
            if padded > rows:
                merged = {
                    k: np.concatenate([v, np.repeat(v[:1], padded - rows, 0)])
                    for k, v in merged.items()
                }
            out = self._run(merged)
            at = 0
            for t in tasks:
                t.result = {k: v[at : at + t.size] for k, v in out.items()}
                at += t.size
        except BaseException as e:  # the batch's error is every task's
            for t in tasks:
                t.error = e
        end = self._clock()
        with self._cv:
            self._q.finished()
            self._cv.notify()
        try:
            self._on_batch((tasks, rows, padded, tasks[0].entered, start, end))
        except Exception:
            log.exception("batch record failed")
        for t in tasks:
            t.done.set()

    def close(self) -> None:
        """Run what is queued at once, then stop (a version unloading; as the real server
        waits for the requests that hold the version, none is refused for it)."""
        with self._cv:
            self._q.closing = True
            self._cv.notify()
        self._thread.join()
        self._pool.shutdown(wait=True)

"""The SimPy reference (``benchmarks/estimator.py``) with admission by predicted completion and
Clockwork's dispatch rule, written from docs/deadlines.md and the live puller, not from the
kernel: the check that ``EstimatorOptions.admission`` simulates the live queue's rules.

At each instant, after every arrival and completion (the reference's dispatch priority), a
model first decides on the queries that entered its queue at that instant, in EDF (index)
order, each seeing the queue before the instant and those admitted before it: admitted when
nothing is queued and a replica is idle, or when it cannot be predicted, or when the live
queue's ``predict_completion`` (the replicas' free times, the profiled batch latency, the
fixed-batching rule) is at most its deadline minus the buffer. Then idle replicas cut batches
as ``_cut_admitted`` does: the rule's latency is that of ``min(max_batch, queued)``, a query
whose deadline minus the buffer is earlier than now plus it is dropped and the next taken.
A refused query never finishes (its other branches still run, as in the kernel).

Doomed queries (the live puller's ``drop_doomed``): a queued query whose deadline minus the
buffer is earlier than the earliest start (now, or the earliest free time when every replica
is busy) plus the shortest batch is answered at once. The live queue checks after each batch
start and on a timer at the earliest doom time; here the timer's drops are applied when the
queue is next looked at (a dispatch at that model), before anything arriving then is judged,
which is when they can change a decision.
"""

from __future__ import annotations

import heapq
from typing import Any

from _simpy_reference import simpy_reference

from inferline.core.estimator import EstimatorAdmission, dispatch_late, predict_completion
from inferline.queueing import AdmissionConfig
from inferline.queueing._admission import doomed, shortest_batch


def admission_reference(
    *args: Any, admission: EstimatorAdmission, doom: bool = True, **kw: Any
) -> Any:
    """A ``SimpyReference`` with ``admission``; its ``refused`` holds the refused queries.
    ``doom=False``: without the doomed rule (the queue before it), to show a case needs it."""
    base = simpy_reference().SimpyReference

    class SimpyAdmission(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(*args, **kw)
            self.adm = admission
            self.refused: set[int] = set()
            self.new: dict[str, list[int]] = {m: [] for m in self.p.models}

        def _enqueue(self, i: int, m: str) -> None:
            self.models[m].enq[i] = self.env.now
            self.new[m].append(i)
            self._request_dispatch(m)

        def _latency(self, m: str, b: int) -> float:
            hw = self.cfg[m].hardware
            sizes = sorted(self.prof.models[m][hw])
            return self.prof.models[m][hw][next(x for x in sizes if x >= b)].latency_s

        def _deadline(self, i: int) -> float:
            return float(self.arr[i]) + self.adm.slo_s

        def _drop_doomed(self, m: str) -> None:
            """The live ``drop_doomed``: the queue is in deadline order, so a prefix."""
            st = self.models[m]
            if not doom:
                return
            live = [r for r in st.replicas if r.state in ("idle", "busy")]
            free = [self.env.now if r.state == "idle" else r.busy_until for r in live]
            cfg = AdmissionConfig("predicted", self.adm.buffer_s)
            mb = self.cfg[m].max_batch_size
            short = shortest_batch(lambda b: self._latency(m, b), mb)
            while st.queue and doomed(
                cfg, self.env.now, self._deadline(st.queue[0][1]), free, short, 0.0
            ):
                self._refuse(heapq.heappop(st.queue)[1], m)

        def _admit_new(self, m: str) -> None:
            st = self.models[m]
            now = self.env.now
            live = [r for r in st.replicas if r.state in ("idle", "busy")]
            free = [now if r.state == "idle" else r.busy_until for r in live]
            mb = self.cfg[m].max_batch_size
            for i in sorted(self.new[m]):
                ahead = len(st.queue)
                if ahead == 0 and any(r.state == "idle" for r in live):
                    ok = True
                else:
                    position = sum(1 for _, j in st.queue if j < i)
                    done = predict_completion(
                        now, position, ahead + 1, free, mb, lambda b: self._latency(m, b)
                    )
                    ok = done is None or done <= self._deadline(i) - self.adm.buffer_s
                if ok:
                    heapq.heappush(st.queue, (float(self.arr[i]), i))
                else:
                    self._refuse(i, m)
            self.new[m] = []

        def _refuse(self, i: int, m: str) -> None:
            self.refused.add(i)
            self.models[m].enq.pop(i, None)

        def _dispatch(self, m: str) -> None:
            st = self.models[m]
            st.dispatch_scheduled = False
            self._drop_doomed(m)  # before the new ones: they are not doomed at arrival
            self._admit_new(m)
            cfg = self.cfg[m]
            now = self.env.now
            while st.idle and st.queue:
                take = min(cfg.max_batch_size, len(st.queue))
                cut = self._latency(m, take)
                batch: list[int] = []
                while st.queue and len(batch) < take:
                    i = heapq.heappop(st.queue)[1]
                    if dispatch_late(self._deadline(i), self.adm.buffer_s, now, cut):
                        self._refuse(i, m)
                    else:
                        batch.append(i)
                        del st.enq[i]
                if not batch:
                    continue
                rep = st.idle.pop()
                rep.state = "busy"
                rep.service = self._service(m, cfg.hardware, len(batch), batch[0])
                wake = self.prof.wake(m, cfg.hardware) if self.opt.wake_up else None
                if wake is not None:
                    rep.service += wake.extra(now - rep.idle_since)
                rep.busy_until = now + rep.service
                st.batches += 1
                rep.go.succeed(batch)
                self._drop_doomed(m)  # what is left, after each batch start

    return SimpyAdmission()

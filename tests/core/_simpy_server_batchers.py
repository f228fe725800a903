"""Independent SimPy models of the servers' own batchers (Triton's dynamic batcher, TF
Serving's batch scheduler), written from BACKENDS.md's rules and the servers' sources, not from
the estimator's kernel: the benchmark's SimPy reference of the estimator contract with the
queue of every server-batched model replaced.

* Triton: a list of ``(entered, query)`` in arrival order. At a look (an idle instance), every
  request whose queue time reached the timeout is rejected, then the queue is walked as
  ``DynamicBatchScheduler::GetDynamicBatch`` does: the pending batch grows until the next
  request would pass ``max_batch_size``, remembering the last preferred size it made.
* TF Serving: a list of batches, the last one open, as ``SharedBatchScheduler``'s queue holds
  them: a request that does not fit the open batch opens a new one, or is refused when the
  queue already holds ``max_enqueued_batches``; a batch thread takes the front batch if it is
  closed, or the open one once it is full or its first request has waited the timeout.

The requests that reach a queue at one instant join it in query order (as the estimator's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from _simpy_reference import simpy_reference

from inferline.core.estimator import TFServingBatcher, TritonBatcher


@dataclass
class _Server:
    batcher: Any
    queue: list[tuple[float, int]] = field(default_factory=list)  # Triton: (entered, query)
    batches: list[list[int]] = field(default_factory=lambda: [[]])  # TF: the last one open
    open_since: float = 0.0  # TF: when the open batch's first request joined it
    incoming: list[tuple[float, int]] = field(default_factory=list)  # this instant's arrivals
    threads_busy: int = 0
    wakes: set[float] = field(default_factory=set)


@functools.cache
def server_reference() -> type:
    """The reference class (built once simpy and the benchmark's model are loaded)."""
    bench = simpy_reference()

    class ServerBatcherReference(bench.SimpyReference):  # type: ignore[name-defined,misc]
        """``SimpyReference`` with ``options.server_batchers`` modelled; after ``run()``,
        ``rejected`` and ``refused`` hold the queries each batcher dropped."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.servers = {m: _Server(b) for m, b in self.opt.server_batchers.items()}
            self.rejected: set[int] = set()
            self.refused: set[int] = set()

        def _enqueue(self, i: int, m: str) -> None:
            if m not in self.servers:
                super()._enqueue(i, m)
                return
            self.servers[m].incoming.append((self.env.now, i))
            self._request_dispatch(m)

        def _dispatch(self, m: str) -> None:
            sv = self.servers.get(m)
            if sv is None:
                super()._dispatch(m)
                return
            self.models[m].dispatch_scheduled = False
            arrived = sorted(sv.incoming, key=lambda e: e[1])
            sv.incoming.clear()
            if isinstance(sv.batcher, TritonBatcher):
                sv.queue.extend(arrived)
                self._triton(m, sv)
            else:
                for _, i in arrived:
                    self._tf_join(sv, i)
                self._tf_run(m, sv)

        # -- Triton ----------------------------------------------------------------------
        def _triton(self, m: str, sv: _Server) -> None:
            b: TritonBatcher = sv.batcher
            now = self.env.now
            tmo = b.default_timeout_microseconds / 1e6
            delay = b.max_queue_delay_microseconds / 1e6
            preferred = set(b.preferred_batch_size) or {b.max_batch_size}
            while self.models[m].idle and sv.queue:
                if tmo > 0:
                    for e, i in [x for x in sv.queue if now >= x[0] + tmo]:
                        self.rejected.add(i)
                        sv.queue.remove((e, i))
                if not sv.queue:
                    return
                pending, best, send_now = 0, 0, False
                for _ in sv.queue:
                    if pending + 1 > b.max_batch_size:
                        send_now = True
                        break
                    pending += 1
                    if pending in preferred:
                        best = pending
                oldest = sv.queue[0][0]
                exceeded = delay > 0 and now >= oldest + delay
                if best and not exceeded:
                    size = best
                elif send_now or pending >= max(preferred) or exceeded or delay == 0:
                    size = pending
                else:
                    self._wake_at(m, sv, oldest + delay)
                    return
                batch = [i for _, i in sv.queue[:size]]
                del sv.queue[:size]
                self._start(m, sv, batch, size)

        # -- TF Serving ------------------------------------------------------------------
        def _tf_join(self, sv: _Server, i: int) -> None:
            b: TFServingBatcher = sv.batcher
            if len(sv.batches[-1]) + 1 > b.max_batch_size:
                if len(sv.batches) >= b.max_enqueued_batches:
                    self.refused.add(i)  # "the batch scheduling queue ... is full"
                    return
                sv.batches.append([])
            if not sv.batches[-1]:
                sv.open_since = self.env.now
            sv.batches[-1].append(i)

        def _tf_run(self, m: str, sv: _Server) -> None:
            b: TFServingBatcher = sv.batcher
            now = self.env.now
            due = sv.open_since + b.batch_timeout_micros / 1e6
            while self.models[m].idle and sv.threads_busy < b.num_batch_threads:
                if len(sv.batches) >= 2:
                    batch = sv.batches.pop(0)
                elif sv.batches[0] and (len(sv.batches[0]) >= b.max_batch_size or now >= due):
                    batch, sv.batches[0] = sv.batches[0], []
                else:
                    if sv.batches[0]:
                        self._wake_at(m, sv, due)
                    return
                padded = min([a for a in b.allowed_batch_sizes if a >= len(batch)] or [len(batch)])
                self._start(m, sv, batch, padded)

        # -- both ------------------------------------------------------------------------
        def _wake_at(self, m: str, sv: _Server, t: float) -> None:
            if t not in sv.wakes:
                sv.wakes.add(t)
                self._call_at(t, 1, lambda: self._request_dispatch(m))

        def _start(self, m: str, sv: _Server, batch: list[int], cost_size: int) -> None:
            st = self.models[m]
            hw = self.cfg[m].hardware
            rep = st.idle.pop()
            rep.state = "busy"
            rep.service = self._service(m, hw, cost_size, batch[0])
            wake = self.prof.wake(m, hw) if self.opt.wake_up else None
            if wake is not None:
                rep.service += wake.extra(self.env.now - rep.idle_since)
            rep.busy_until = self.env.now + rep.service
            sv.threads_busy += 1
            rep.go.succeed(batch)

        def _replica(self, rep: Any, delay: float | None):  # type: ignore[no-untyped-def]
            """The base replica, which also frees its batch thread (and looks at the
            queue again) when a batch ends, retiring or not."""
            if rep.model not in self.servers:
                return (yield from super()._replica(rep, delay))
            st = self.models[rep.model]
            sv = self.servers[rep.model]
            if delay is not None:
                yield self.env.timeout(delay)
                if rep.state != "pending":
                    return None
                rep.idle_since = self.env.now
            while True:
                rep.state = "idle"
                rep.go = self.env.event()
                st.idle.append(rep)
                self._request_dispatch(rep.model)
                batch = yield rep.go
                yield self.env.timeout(rep.service)
                rep.idle_since = self.env.now
                sv.threads_busy -= 1
                for i in batch:
                    self._finished(i, rep.model)
                if rep.state == "retiring":
                    rep.state = "gone"
                    self._request_dispatch(rep.model)
                    return None

    return ServerBatcherReference

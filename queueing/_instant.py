"""When an instant is over: the barrier a puller passes before it cuts a batch.

Rule 3 of the estimator contract (docs/design.md "The estimator contract"): at one instant, all
arrivals and completions are applied before any idle replica takes a batch, so a batch of 8
finishing upstream hands all 8 to an idle downstream replica at once. An asyncio program has no
instants: the queries of a finished batch reach their next ``predict`` through however many
task hops the pipeline's code takes (``gather`` runs branches as new tasks, a join wakes its
parent through gather's callback, the cache wakes the callers of a shared evaluation through
``shield``, the code may await anything in between). A puller that cut its batch when the first
of them arrived would take 3 of the 8 and leave 5 for a later batch.

The barrier ends an instant by counting what the queue knows about, not by reading the event
loop's internals (uvloop, the production loop, has no ready queue to read), so it is the same
code on every loop:

- Hand-offs in transit. ``PipelineRunner`` gives each query a ``Handoff``. A query is in
  transit from its arrival until its first model call, and again whenever none of its model
  calls is unanswered (between two stages), until its next call or its end. A result the
  dispatcher sets is in transit until the query's ``predict`` returns it, however many hops
  lie between. The instant is not over while anything is in transit, whatever the number of
  hops.
- Quiet rounds. What no hand-off covers (the branches a ``gather`` is about to start, callers
  of ``Dispatcher.submit`` without a runner, tasks woken by timers due at the same time) shows
  as activity: every submit, every finished batch and every change of a hand-off counts. The
  instant is over at the first loop iteration with nothing in transit and no activity since
  the iteration before.
- A bound. The instant lasts at most ``max_rounds`` loop iterations, so a query that keeps its
  hand-off while it awaits something else between two stages (a remote call) delays batches
  by a few iterations and never starves a replica.

The barrier is one callback that re-schedules itself with ``call_soon`` while pullers wait at
it (nothing runs otherwise), and pullers wait on futures it resolves. On the virtual-time loop
of the tests no time passes while it runs, so an instant is exactly the estimator's instant.
"""

from __future__ import annotations

import asyncio

__all__: list[str] = []  # private to the package


class _Instant:
    """The same-instant barrier shared by one dispatcher's pullers (see the module docstring).

    ``activity`` and ``in_transit`` are counters that the dispatcher and the hand-offs update
    directly (one attribute increment on the hot path).
    """

    __slots__ = (
        "_armed",
        "_loop",
        "_rounds",
        "_seen",
        "_waiters",
        "activity",
        "in_transit",
        "max_rounds",
    )

    def __init__(self, max_rounds: int) -> None:
        self.max_rounds = max_rounds
        self.activity = 0  # bumped by every submit, finished batch and hand-off change
        self.in_transit = 0  # queries between two model calls plus results on their way
        self._waiters: list[asyncio.Future[None]] = []
        self._armed = False
        self._rounds = 0
        self._seen = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """Return once the current instant is over (at once when ``max_rounds`` is 0)."""
        if self.max_rounds <= 0:
            return
        w = loop.create_future()
        self._waiters.append(w)
        if not self._armed:
            self._armed = True
            self._rounds = 0
            self._seen = self.activity
            self._loop = loop
            loop.call_soon(self._round)
        await w

    def _round(self) -> None:
        self._rounds += 1
        busy = self.in_transit > 0 or self.activity != self._seen
        if busy and self._rounds < self.max_rounds:
            self._seen = self.activity
            assert self._loop is not None
            self._loop.call_soon(self._round)
            return
        self._armed = False
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


class Handoff:
    """One pipeline query's share of ``_Instant.in_transit``: one while it has no model call
    unanswered, plus one per result set for it and not yet returned by its ``predict``.

    ``PipelineRunner`` opens it when the query arrives and closes it when the query ends;
    ``PipelineContext.predict`` reports ``call``/``answered``; the dispatcher reports
    ``delivered`` when it answers a call that carried this hand-off.
    """

    __slots__ = ("_calls", "_delivered", "_instant", "_open")

    def __init__(self, instant: _Instant) -> None:
        self._instant = instant
        self._calls = 0  # model calls made and not answered yet
        self._delivered = 0  # results set by the dispatcher and not returned by predict yet
        self._open = True
        instant.in_transit += 1  # arrived: in transit until its first model call
        instant.activity += 1

    def call(self) -> None:
        """A model call starts (``predict`` entered)."""
        self._calls += 1
        inst = self._instant
        if self._calls == 1 and self._open:
            inst.in_transit -= 1
        inst.activity += 1

    def delivered(self) -> None:
        """The dispatcher set the result (or the error) of one of this query's calls."""
        if self._open:
            self._delivered += 1
            self._instant.in_transit += 1

    def answered(self) -> None:
        """A model call returned (or raised) into the pipeline's code."""
        self._calls -= 1
        if not self._open:
            return
        inst = self._instant
        if self._delivered:
            self._delivered -= 1
            inst.in_transit -= 1
        if self._calls == 0:
            inst.in_transit += 1
        inst.activity += 1

    def close(self) -> None:
        """The query ended (its pipeline function returned or raised). Idempotent."""
        if not self._open:
            return
        self._open = False
        inst = self._instant
        inst.in_transit -= self._delivered + (self._calls == 0)
        self._delivered = 0
        inst.activity += 1

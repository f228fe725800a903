"""A stage switched between model variants (``StageSwitch``) against an independent SimPy model
of the same thing: the stage keeps ONE EDF queue, each replica runs one variant (its latency
table and batch size, chosen when the replica cuts a batch), the new variant's replicas serve
after the activation delay and the old ones then leave (a busy one after its batch). That is
what the live dispatcher's shared stage queue does (``Dispatcher.share``, docs/variants.md).

The reference subclasses ``benchmarks/estimator.py``'s ``SimpyReference`` (it shares nothing
with the kernel); only the switch and the per-replica variant are added here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from _simpy_reference import simpy_reference

from inferline.core import EstimatorOptions, ModelConfig, Pipeline, Profiles, StageSwitch, simulate

PIPE = Pipeline.linear("p", ["a", "b"])
PROF = Profiles.from_latencies(
    {
        "a": {"cpu": {1: 1.0, 2: 1.2, 3: 1.3, 4: 1.4}},  # the stage's own profile: slow
        "fast": {"cpu": {1: 0.25, 2: 0.3, 3: 0.34, 4: 0.37}},
        "b": {"cpu": {1: 0.05, 2: 0.06, 3: 0.07, 4: 0.08}},
    }
)
OPT = EstimatorOptions(activation_delay_s=0.7)
INTERVAL = 0.5


class Script:
    interval_s = INTERVAL

    def __init__(self, at: dict[float, dict[str, object]]) -> None:
        self.at = at

    def observe(self, now_s, new_arrivals, state):  # type: ignore[no-untyped-def]
        return self.at.get(now_s)


def switch_reference(arrivals: np.ndarray, configs: dict[str, ModelConfig], switches: list) -> Any:
    """The SimPy model with ``switches``: ``(time, stage, variant, ModelConfig)``."""
    base = simpy_reference()

    class SwitchReference(base.SimpyReference):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__(PIPE, configs, PROF, arrivals, options=OPT)
            self.var: dict[int, tuple[str, int]] = {}  # replica -> (variant, its batch size)

        def _dispatch(self, m: str) -> None:
            if m != "a":
                return super()._dispatch(m)
            st = self.models[m]
            st.dispatch_scheduled = False
            while st.idle and st.queue:
                rep = st.idle.pop()  # the warmest: the variant of the batch is its replica's
                variant, maxb = self.var[id(rep)]
                b = min(maxb, len(st.queue))
                batch = [base.heapq.heappop(st.queue)[1] for _ in range(b)]
                for i in batch:
                    del st.enq[i]
                rep.state = "busy"
                sizes = sorted(self.prof.models[variant]["cpu"])
                rep.service = self.prof.models[variant]["cpu"][
                    next(x for x in sizes if x >= b)
                ].latency_s
                rep.busy_until = self.env.now + rep.service
                st.batches += 1
                rep.go.succeed(batch)
            return None

        def _switcher(self):  # type: ignore[no-untyped-def]
            for t, stage, variant, cfg in switches:
                if self.env.now < t:
                    yield self._at(float(t), 0)  # before the other events of that instant
                st = self.models[stage]
                old = [r for r in st.replicas if r.state in ("pending", "idle", "busy")]
                for _ in range(cfg.replicas):
                    rep = base._Replica(stage)
                    self.var[id(rep)] = (variant, cfg.max_batch_size)
                    st.replicas.append(rep)
                    self.env.process(self._replica(rep, self.opt.activation_delay_s))
                self._call_at(t + self.opt.activation_delay_s, 0, lambda o=old: self._leave(o))

        def _leave(self, old: list) -> None:
            st = self.models["a"]
            for r in old:
                if r.state == "idle":
                    st.idle.remove(r)
                    r.state = "gone"
                elif r.state == "busy":
                    r.state = "retiring"

        def run(self) -> np.ndarray:
            for m in self.p.models:
                for _ in range(self.cfg[m].replicas):
                    rep = base._Replica(m, state="idle")
                    self.var[id(rep)] = (m, self.cfg[m].max_batch_size)
                    self.models[m].replicas.append(rep)
                    self.env.process(self._replica(rep, None))
            self.env.process(self._source())
            self.env.process(self._switcher())
            self.env.run()
            lat = self.finish - self.arr
            lat[np.array(self.left) > 0] = np.inf
            return lat

    return SwitchReference().run()


def _case(seed: int) -> tuple[np.ndarray, dict[str, ModelConfig], list]:
    rng = np.random.default_rng(seed)
    rate = rng.uniform(1.0, 4.0)
    arr = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, 80))])
    configs = {
        "a": ModelConfig("cpu", int(rng.integers(1, 3)), int(rng.integers(1, 3))),
        "b": ModelConfig("cpu", 2, 1),
    }
    t1 = INTERVAL * int(rng.integers(2, 12))
    t2 = t1 + INTERVAL * int(rng.integers(3, 12))  # after the first switch took effect
    switches = [
        (t1, "a", "fast", ModelConfig("cpu", int(rng.integers(1, 5)), int(rng.integers(1, 3)))),
        (t2, "a", "a", ModelConfig("cpu", int(rng.integers(1, 3)), int(rng.integers(1, 4)))),
    ]
    return arr, configs, switches


@pytest.mark.parametrize("seed", range(12))
def test_stage_switches_agree_with_the_simpy_shared_queue(seed: int) -> None:
    arr, configs, switches = _case(seed)
    script = Script({t: {s: StageSwitch(v, c)} for t, s, v, c in switches})
    ours = simulate(
        PIPE, configs, PROF, arr, options=OPT, controller=script, variants={"a": ["fast"]}
    ).latencies_s
    ref = switch_reference(arr, configs, switches)
    assert math.isfinite(ours.max())
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9)

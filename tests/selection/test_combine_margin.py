"""The combine/return allowance of served ensembles (``selection.CombineAllowance``) and the
selection app's pipeline that combines at arrival + SLO - margin.

Each test names the injected bug it catches."""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import pytest

from inferline.core import ValidationError
from inferline.selection import AllowanceState, CombineAllowance, Exp4, SelectionService
from inferline.server._selection_app import EnsemblePipeline, SelectionAppSpec


def test_round_trips() -> None:
    a = CombineAllowance(0.004, False, 0.2, 0.3, 3.0, 0.25)
    assert CombineAllowance.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    st = AllowanceState(0.001, 0.0005, 7)
    assert AllowanceState.from_dict(json.loads(json.dumps(st.to_dict()))) == st
    spec = SelectionAppSpec.from_dict(
        {
            "policy": "exp4",
            "models": ["a"],
            "combine_margin_ms": 2.5,
            "measure_combine_margin": False,
        }
    )
    assert SelectionAppSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.allowance() == CombineAllowance(0.0025, False)
    default = SelectionAppSpec.from_dict({"policy": "exp4", "models": ["a"]})
    assert default.allowance() == CombineAllowance(0.007, True)


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"combine_margin_ms": -1}, "combine_margin_ms"),
        ({"combine_margin_ms": math.inf}, "combine_margin_ms"),
        ({"combine_margin_ms": "5"}, "combine_margin_ms"),
        ({"measure_combine_margin": "yes"}, "measure_combine_margin"),
    ],
)
def test_bad_margin_settings_name_their_field(block: dict[str, Any], field: str) -> None:
    """Catches: a negative/infinite margin or a non-boolean switch accepted."""
    with pytest.raises(ValidationError) as e:
        SelectionAppSpec.from_dict({"policy": "exp4", "models": ["a"], **block}, "apps.v.selection")
    assert e.value.field == f"apps.v.selection.{field}"
    with pytest.raises(ValidationError):
        CombineAllowance(fixed_s=-0.001)


def test_margin_is_fixed_plus_the_measured_tail_capped() -> None:
    """EWMA of the mean and mean deviation (Jacobson), margin = fixed + mean + 4 dev, capped
    at half the SLO; negative samples (every model answered early) are ignored. Catches: the
    measured part ignored, no cap, early answers pulling the estimate down."""
    a = CombineAllowance(0.005)
    st = a.init()
    assert a.margin_s(st, 0.1) == 0.005
    st = a.observe(st, 0.002)
    assert (st.mean_s, st.dev_s, st.samples) == (0.002, 0.001, 1)
    assert a.margin_s(st, 0.1) == pytest.approx(0.005 + 0.002 + 0.004)
    st2 = a.observe(st, 0.004)
    assert st2.mean_s == pytest.approx(0.002 + 0.125 * 0.002)
    assert st2.dev_s == pytest.approx(0.001 + 0.25 * (0.002 - 0.001))
    assert a.observe(st2, -0.05) == st2 and a.observe(st2, math.nan) == st2
    assert a.margin_s(st2, 0.01) == 0.005  # capped at half the SLO
    fixed = CombineAllowance(0.005, measured=False)
    assert fixed.observe(fixed.init(), 0.01) == fixed.init()


def test_deviation_never_goes_negative_when_answers_slow_down_then_speed_up() -> None:
    """Answers 1 ms late climbing to 40 ms, then dropping back to 0: the deviation is an
    EWMA of *absolute* errors, so it stays >= 0 on the way down and the margin never falls
    under the fixed part plus the mean (it is the Jacobson estimate recomputed here).
    Fails if the deviation takes the signed error (``err`` for ``abs(err)``): a fast answer
    after slow ones drives it negative and the margin below fixed + mean."""
    a = CombineAllowance(0.005)
    st = a.init()
    mean = dev = 0.0
    lates = [0.001 * i for i in range(1, 41)] + [0.0] * 10 + [0.04, 0.0, 0.03, 0.0]
    for i, late in enumerate(lates):
        st = a.observe(st, late)
        if i == 0:
            mean, dev = late, late / 2
        else:
            err = late - mean
            mean, dev = mean + 0.125 * err, dev + 0.25 * (abs(err) - dev)
        assert st.dev_s >= 0.0, (i, late, st)
        assert st.mean_s == pytest.approx(mean, abs=1e-12)
        assert st.dev_s == pytest.approx(dev, abs=1e-12)
        m = a.margin_s(st, 10.0)  # a long SLO: the cap is out of the way
        assert m >= 0.005 + st.mean_s - 1e-12, (i, m, st)
        assert m == pytest.approx(0.005 + st.mean_s + 4 * st.dev_s)
    assert st.samples == len(lates)


class _Ctx:
    def __init__(self, arrival: float, slo_s: float, call: Any) -> None:
        self.arrival = arrival
        self.deadline = arrival + slo_s
        self.predict = call


def test_the_pipeline_combines_before_the_deadline_and_learns_the_margin() -> None:
    """A fast model and a straggler (1 s): the answer leaves at arrival + SLO - margin, with
    the straggler missing, and the measured part grows from the answers. Catches: combining
    at the deadline itself (the first bug of the issue), waiting for the straggler."""

    async def call(m: str, x: Any) -> Any:
        await asyncio.sleep(0.0 if m == "fast" else 1.0)
        return 1

    async def main() -> tuple[list[float], list[Any], EnsemblePipeline]:
        loop = asyncio.get_running_loop()
        policy = Exp4(["fast", "slow"], rng=random.Random(0))
        sel = SelectionService("v", policy, None, clock=loop.time)
        pipe = EnsemblePipeline(sel, CombineAllowance(0.02), loop.time)
        took, outs = [], []
        for _ in range(5):
            t0 = loop.time()
            outs.append(await pipe(0, _Ctx(t0, 0.2, call)))
            took.append(loop.time() - t0)
        return took, outs, pipe

    took, outs, pipe = asyncio.run(main())
    assert all(o["models_contributed"] == 1 and o["models_selected"] == 2 for o in outs)
    # first query: margin 20 ms (nothing measured yet), answered ~180 ms after arrival
    assert 0.175 <= took[0] < 0.195, took
    assert all(t < 0.2 for t in took), took
    assert pipe.state.samples == 5
    assert pipe.margin_s(0.2) > 0.02

"""The planner with admission on (``PlannerOptions.admission``, ``max_refused``): a plan is
feasible when SLO misses plus refusals stay within the percentile and refusals within
``max_refused``, judged by the estimator with the live queue's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferline.core import (
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    simulate,
)
from inferline.core.estimator import EstimatorAdmission

SLO = 0.1


def _case() -> tuple[Pipeline, Profiles, np.ndarray]:
    pipe = Pipeline.linear("two", ["a", "b"])
    prof = Profiles.from_latencies(
        {
            m: {
                "gpu-k80": {b: base * (1 + 0.3 * b) for b in (1, 2, 4, 8)},
                "cpu": {b: 3 * base * b for b in (1, 2, 4, 8)},
            }
            for m, base in (("a", 0.008), ("b", 0.012))
        }
    )
    return pipe, prof, gamma_trace(150.0, 4.0, 12.0, np.random.default_rng(4))


def _judge(
    pipe: Pipeline, prof: Profiles, configs: dict[str, ModelConfig], trace: np.ndarray
) -> tuple[int, int]:
    """(SLO misses plus refusals, refusals) of a direct estimator run with admission."""
    opt = EstimatorOptions(admission=EstimatorAdmission(SLO))
    r = simulate(pipe, configs, prof, trace, options=opt)
    return int(np.count_nonzero(r.latencies_s > SLO)), int(np.count_nonzero(r.refused_late))


def _plan(max_refused: float | None, **kw: object) -> tuple[object, Planner]:
    pipe, prof, trace = _case()
    o = PlannerOptions(rate_margin=0.0, admission=True, max_refused=max_refused, **kw)  # type: ignore[arg-type]
    planner = Planner(pipe, prof, trace, SLO, options=o)
    return planner.plan(), planner


@pytest.mark.parametrize("max_refused", [None, 0.001])
def test_the_plan_meets_misses_plus_refusals_and_max_refused(max_refused: float | None) -> None:
    pipe, prof, trace = _case()
    plan, _ = _plan(max_refused)
    misses, refused = _judge(pipe, prof, dict(plan.models), trace)
    n = trace.size
    # numpy's percentile with refusals above the SLO: at most n - 1 - floor((n-1) p) misses
    assert misses <= n - 1 - math.floor((n - 1) * 0.99)
    if max_refused is not None:
        assert refused <= math.floor(max_refused * n + 1e-9)
    assert plan.estimated_latency_s <= SLO
    # the early stop is exact: the same plan without it
    off, _ = _plan(max_refused, early_stop=False)
    assert off.to_dict() == plan.to_dict()  # type: ignore[attr-defined]


def test_a_tighter_max_refused_never_costs_less() -> None:
    free, _ = _plan(None)
    tight, _ = _plan(0.0)
    assert tight.cost_per_hour >= free.cost_per_hour  # type: ignore[attr-defined]


def test_options_round_trip_and_errors_name_the_field() -> None:
    o = PlannerOptions(admission=True, admission_buffer_s=0.003, max_refused=0.01)
    assert PlannerOptions.from_dict(o.to_dict()) == o
    assert "admission" not in PlannerOptions().to_dict()
    with pytest.raises(ValidationError, match="max_refused"):
        PlannerOptions(max_refused=0.01)  # needs admission
    with pytest.raises(ValidationError, match="max_refused"):
        PlannerOptions.from_dict({"admission": True, "max_refused": 2})
    with pytest.raises(ValidationError, match="admission"):
        PlannerOptions(admission=True, server="triton")
    with pytest.raises(ValidationError, match=r"estimator\.admission"):
        PlannerOptions(estimator=EstimatorOptions(admission=EstimatorAdmission(0.1)))


def test_inferline_plan_admission_flags(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from inferline.cli import main
    from inferline.core import load_plan, save, save_trace

    pipe, prof, trace = _case()
    save(pipe, tmp_path / "p.json")
    save(prof, tmp_path / "prof.json")
    save_trace(trace[trace < 4.0], tmp_path / "t.trace")
    args = ["plan", "--pipeline", str(tmp_path / "p.json"), "--profiles"]
    args += [str(tmp_path / "prof.json"), "--trace", str(tmp_path / "t.trace")]
    args += ["--slo-s", "0.1", "--no-ladder", "--rate-margin", "0", "-o", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit):
        main([*args, "--max-refused", "0.001"])
    assert "--max-refused: needs --admission" in capsys.readouterr().err
    assert main([*args, "--admission", "--max-refused", "0"]) == 0
    plan = load_plan(tmp_path / "x.json")
    misses, refused = _judge(pipe, prof, dict(plan.models), trace[trace < 4.0])
    assert refused == 0 and misses == 0


def test_inferline_plan_takes_admission_and_max_refused_from_the_deployment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--deployment``: its queue's admission and its app's max_refused make the same plan as
    the flags; a flag given wins over the file."""
    import json

    from inferline.cli import main
    from inferline.core import load_plan, save, save_trace
    from inferline.demo.simple import sleep_deployment

    pipe, prof, trace = _case()
    save(pipe, tmp_path / "p.json")
    save(prof, tmp_path / "prof.json")
    save_trace(trace[trace < 4.0], tmp_path / "t.trace")
    d = sleep_deployment(slo_ms=100.0)
    d["queue"] = {**d["queue"], "admission": "predicted"}
    d["apps"]["app"]["max_refused"] = 0.0
    (tmp_path / "dep.json").write_text(json.dumps(d))
    args = ["plan", "--pipeline", str(tmp_path / "p.json"), "--profiles"]
    args += [str(tmp_path / "prof.json"), "--trace", str(tmp_path / "t.trace")]
    args += ["--slo-s", "0.1", "--no-ladder", "--rate-margin", "0"]
    out = {k: tmp_path / f"plan-{k}.json" for k in ("flags", "dep", "loose", "none")}
    assert main([*args, "-o", str(out["flags"]), "--admission", "--max-refused", "0"]) == 0
    assert main([*args, "-o", str(out["dep"]), "--deployment", str(tmp_path / "dep.json")]) == 0
    dep_args = ["--deployment", str(tmp_path / "dep.json"), "--max-refused", "0.5"]
    assert main([*args, "-o", str(out["loose"]), *dep_args]) == 0
    assert main([*args, "-o", str(out["none"])]) == 0
    plans = {k: load_plan(v) for k, v in out.items()}
    assert dict(plans["dep"].models) == dict(plans["flags"].models)
    misses, refused = _judge(pipe, prof, dict(plans["dep"].models), trace[trace < 4.0])
    assert refused == 0 and misses == 0
    # the flag wins: allowed to refuse up to half, the plan is no dearer than with none allowed
    assert plans["loose"].cost_per_hour <= plans["dep"].cost_per_hour

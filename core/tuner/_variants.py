"""Tuning with model variants (the document is ``core/_variants.py``, format
``inferline.variants/1``): the tuner may switch a stage to a cheaper variant instead of adding
replicas.

:class:`VariantTuner` wraps ``TunerPolicy``: when the policy decides to scale up, each variant
stage may instead switch to a cheaper variant (floors held). Without a ladder the alternative
is provisioned with the paper's rule (``ceil(rate * s / (mu' * rho))``, ``mu'`` the new
variant's single-replica throughput at the stage's hardware and batch size); with the plan's
ladder it is the ladder's configuration with each switched stage resized to keep its
throughput at the same batch size. The cheapest alternative whose cost is below the plain
scale-up and whose estimated tail latency meets the SLO (the estimator on a seeded gamma trace,
at the batch sizes that will run and at the rate the plain decision provisions for) replaces
it; the decision says which stages switched and why. Back at the plan's configuration, with
traffic the plan's own tuner would not scale up for, the stages switch back to the plan's
variants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import LadderStep, ModelConfig, Plan, TunerModel
from .._profiles import Profiles
from .._trace import gamma_trace
from .._variants import PipelineVariants, pipeline_accuracy, stage_profiles
from ..errors import NotFoundError, ValidationError
from ..estimator import simulate
from ..planning import VariantPlan, largest_feasible
from ._config import TunerConfig
from ._policy import TunerPolicy
from ._state import TunerDecision, TunerState

__all__ = ["VariantDecision", "VariantTuner"]


@dataclass(frozen=True)
class VariantDecision:
    """A tuner decision that may also switch stages to other variants."""

    decision: TunerDecision
    variants: Mapping[str, str]  # the variant serving every variant stage after the decision
    switched: Mapping[str, tuple[str, str]]  # stage -> (old, new), empty for a plain decision
    cost_per_hour: float
    scale_up_cost_per_hour: float | None = None  # what plain scaling would have cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_dict(),
            "variants": dict(self.variants),
            "switched": {k: list(v) for k, v in self.switched.items()},
            "cost_per_hour": self.cost_per_hour,
            "scale_up_cost_per_hour": self.scale_up_cost_per_hour,
        }


class VariantTuner:
    """``TunerPolicy`` plus variant switching on scale-up (see the module docstring).

    Holds the current choice and policy (rebuilt with the new variant's throughput after a
    switch); ``step(state, now_s, peaks)`` returns ``(state, VariantDecision | None)``.
    Pure: the estimator runs on a gamma trace drawn from ``seed``.

    With a ladder (the policy's configurations carry batch sizes), an alternative keeps the
    decision's configuration and gives each switched stage the replicas that keep its
    throughput at the same batch size and hardware (``ceil(k * mu_old(b) / mu_new(b))``); it is
    checked at the rate the step was chosen for (the rate with the headroom) at the decision's
    batch sizes, which are what runs. After a switch the ladder's steps are rewritten the same
    way and re-checked (a step that fails is dropped), so the tuner goes on choosing proven
    configurations for the variants that serve. Without a ladder, the paper's replica rule.
    When a scale-down returns to the plan's configuration the stages switch back to the plan's
    variants: the plan is proven for them at that traffic.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        variants: PipelineVariants,
        profiles: Profiles,
        vplan: VariantPlan,
        config: TunerConfig | None = None,
        *,
        accuracy_floor: float | None = None,
        catalog: HardwareCatalog = DEFAULT_CATALOG,
        check_queries: int = 4000,
        cv: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.pipeline = pipeline
        self.variants = variants
        self.profiles = profiles
        self.plan = vplan.plan
        self.choice = dict(vplan.choice)
        self.floor = variants.accuracy_floor if accuracy_floor is None else accuracy_floor
        self.catalog = catalog
        self.config = config if config is not None else TunerConfig()
        self.check_queries = check_queries
        self.cv = cv
        self.seed = seed
        self.policy = TunerPolicy.from_plan(self.plan, self.config)
        # what a return to the plan restores
        self._plan_choice = dict(vplan.choice)
        self._plan_policy = self.policy

    @classmethod
    def from_plan(cls, plan: Plan, config: TunerConfig | None = None, **kw: Any) -> VariantTuner:
        """The tuner of a plan made with variants (``Plan.variants``, what ``inferline plan
        --variants`` writes); raises ``ValidationError`` for a plan without them."""
        v = plan.variants
        if v is None:
            raise ValidationError("plan.variants", "a plan made with variants", None)
        vplan = VariantPlan(plan, dict(v.choice), v.accuracy)
        return cls(
            Pipeline.from_dict(v.pipeline),
            PipelineVariants.from_dict(v.spec),
            Profiles.from_dict(v.profiles),
            vplan,
            config,
            **kw,
        )

    def initial_state(self, now_s: float = 0.0) -> TunerState:
        return self.policy.initial_state(now_s)

    def warm(self) -> float:
        """Run the estimator once on the plan (loads or compiles its kernel, up to seconds on
        a fresh machine), so a live tuner's first switch decision does not pay for it; the
        plan's estimated tail latency at its planned rate."""
        k = {m: c.replicas for m, c in self.plan.models.items()}
        b = {m: c.max_batch_size for m, c in self.plan.models.items()}
        rate = max(self.policy.inputs.mean_rate_qps, 1.0)
        return self._estimate(self.choice, k, b, rate)

    @property
    def windows(self) -> tuple[float, ...]:
        return self.policy.windows

    def cost(self, replicas: Mapping[str, int]) -> float:
        return sum(self.catalog.cost(self.plan.models[m].hardware) * n for m, n in replicas.items())

    def step(
        self, state: TunerState, now_s: float, peaks: Sequence[int]
    ) -> tuple[TunerState, VariantDecision | None]:
        new_state, d = self.policy.step(state, now_s, peaks)
        if d is None:
            held = None
            if self.choice != self._plan_choice:
                held = self._plan_holds(new_state, now_s, peaks)
            if held is not None:
                return self._return_to_plan(held[0], now_s, held[1])
            return new_state, None
        plain_cost = self.cost(d.replicas)
        if d.action != "up":
            if (
                self.choice != self._plan_choice
                and self._at_plan(d)
                and self._plan_fits(new_state, now_s)
            ):
                return self._switch_back(new_state, d, plain_cost)
            return new_state, VariantDecision(d, dict(self.choice), {}, plain_cost)
        alt = self._cheaper_variant(d)
        if alt is None:
            return new_state, VariantDecision(d, dict(self.choice), {}, plain_cost, plain_cost)
        choice, replicas, cost, est, rate = alt
        switched = {s: (self.choice[s], v) for s, v in choice.items() if self.choice[s] != v}
        self._adopt(choice)
        text = ", ".join(f"{s} {a}->{b}" for s, (a, b) in switched.items())
        reason = (
            f"{d.reason}; instead switch {text} (accuracy "
            f"{pipeline_accuracy(self.pipeline, self.variants, choice):.4f} >= floor), "
            f"${cost:.3f}/h < ${plain_cost:.3f}/h, estimated P{self.plan.percentile:g} "
            f"{est * 1e3:.0f} ms at {rate:.1f} q/s"
        )
        nd = replace(d, replicas=dict(replicas), reason=reason)
        st = replace(new_state, replicas=dict(replicas))
        return st, VariantDecision(nd, dict(self.choice), switched, cost, plain_cost)

    # -- internals ----------------------------------------------------------------------
    def _batch(self, d: TunerDecision) -> dict[str, int]:
        """The batch sizes that run after ``d``: its own (ladder), else the plan's."""
        return {m: int(d.batch.get(m, c.max_batch_size)) for m, c in self.plan.models.items()}

    def _at_plan(self, d: TunerDecision) -> bool:
        if any(d.replicas[m] != c.replicas for m, c in self.plan.models.items()):
            return False
        return not d.batch or d.batch == {m: c.max_batch_size for m, c in self.plan.models.items()}

    def _plan_holds(
        self, state: TunerState, now_s: float, peaks: Sequence[int]
    ) -> tuple[TunerState, TunerDecision | None] | None:
        """When the configuration is the plan's, stable for the stabilization delay, the plan's
        own tuner would keep no more than the plan for the traffic of its horizons, and would
        not scale it up now (with the plan's variants): that tuner's step (it may settle batch
        sizes); else None."""
        c = self.plan.models
        if any(state.replicas[m] != c[m].replicas for m in c):
            return None
        if now_s - state.last_change_s < self.config.stabilization_delay_s:
            return None
        if not self._plan_fits(state, now_s):
            return None
        st, d = self._plan_policy.step(state, now_s, peaks)
        return None if d is not None and d.action == "up" else (st, d)

    def _plan_fits(self, state: TunerState, now_s: float) -> bool:
        """Whether the plan's own tuner would keep no more than the plan's counts for the
        traffic of its horizons (not this tick's peaks alone: a tick may see no arrival), and
        no window exceeds the planned envelope. A scale-down of the switched variants' policy
        may reach the plan's counts at traffic the plan's variants cannot serve with them."""
        need = self._plan_policy.traffic_need(state, now_s)
        if not all(need[m] <= c.replicas for m, c in self.plan.models.items()):
            return False
        # nor while a window still holds traffic above the planned envelope: the plan's
        # tuner would scale up (and so switch again) as soon as a tick's rise reads it
        return not self._plan_policy.uses_ladder or self._plan_policy.within_envelope(state, now_s)

    def _return_to_plan(
        self, state: TunerState, now_s: float, d: TunerDecision | None
    ) -> tuple[TunerState, VariantDecision]:
        """Back to the plan's variants; replica counts stay the plan's."""
        if d is None:
            reps = {m: c.replicas for m, c in self.plan.models.items()}
            d = TunerDecision(
                float(now_s), reps, "the traffic fits the plan", 0.0, 0.0, "down", dict(state.batch)
            )
        else:
            d = replace(d, action="down")
        st = replace(state, last_change_s=float(now_s))  # the variants' replicas load: a change
        return self._switch_back(st, d, self.cost(d.replicas))

    def _switch_back(
        self, state: TunerState, d: TunerDecision, cost: float
    ) -> tuple[TunerState, VariantDecision]:
        switched = {s: (v, self._plan_choice[s]) for s, v in self.choice.items()}
        switched = {s: ab for s, ab in switched.items() if ab[0] != ab[1]}
        self.choice = dict(self._plan_choice)
        self.policy = self._plan_policy
        text = ", ".join(f"{s} {a}->{b}" for s, (a, b) in switched.items())
        nd = replace(d, reason=f"{d.reason}; back at the plan: switch {text} (the plan's variants)")
        return state, VariantDecision(nd, dict(self.choice), switched, cost)

    def _model(self, stage: str, variant: str) -> TunerModel:
        old = self.policy.inputs.models[stage]
        c = self.plan.models[stage]
        mu = self.profiles.throughput(variant, c.hardware, c.max_batch_size)
        return TunerModel(old.scale_factor, mu, old.max_provisioning_ratio)

    def _need(self, rate: float, choice: Mapping[str, str]) -> dict[str, int]:
        out = {}
        for m in self.pipeline.models:
            t = (
                self._model(m, choice[m])
                if m in choice and choice[m] != self.choice[m]
                else self.policy.inputs.models[m]
            )
            out[m] = max(
                1,
                math.ceil(
                    rate * t.scale_factor / (t.throughput_qps * t.max_provisioning_ratio) - 1e-9
                ),
            )
        return out

    def _resized(
        self, replicas: Mapping[str, int], batch: Mapping[str, int], choice: Mapping[str, str]
    ) -> dict[str, int] | None:
        """``replicas`` with every stage switched in ``choice`` given the replicas that keep
        its throughput at its batch size and hardware; None if a variant lacks that profile."""
        out = dict(replicas)
        for s, v in choice.items():
            if v == self.choice[s]:
                continue
            hw, b = self.plan.models[s].hardware, batch[s]
            try:
                ratio = self.profiles.throughput(self.choice[s], hw, b) / self.profiles.throughput(
                    v, hw, b
                )
            except (ValidationError, NotFoundError):
                return None
            out[s] = max(1, math.ceil(replicas[s] * ratio - 1e-9))
        return out

    def _estimate(
        self,
        choice: Mapping[str, str],
        replicas: Mapping[str, int],
        batch: Mapping[str, int],
        rate: float,
    ) -> float:
        """The estimator's tail latency of a configuration on a seeded gamma trace at ``rate``."""
        rng = np.random.default_rng(self.seed)
        trace = gamma_trace(rate, self.cv, self.check_queries / max(rate, 1e-9), rng)
        configs = {
            m: ModelConfig(c.hardware, batch[m], replicas[m]) for m, c in self.plan.models.items()
        }
        prof = stage_profiles(self.profiles, choice)
        res = simulate(self.pipeline, configs, prof, trace, catalog=self.catalog)
        return float(res.percentile(self.plan.percentile))

    def _cheaper_variant(
        self, d: TunerDecision
    ) -> tuple[dict[str, str], dict[str, int], float, float, float] | None:
        plain = self.cost(d.replicas)
        batch = self._batch(d)
        ladder = self.policy.uses_ladder and bool(d.batch)
        # the ladder chose its step for the rate with the headroom: hold the alternative to it
        rate = self.policy.room(d.rate_qps, self.config.headroom) if ladder else d.rate_qps
        options = []
        for ch in self.variants.choices():
            if ch == self.choice:
                continue
            if (
                self.floor is not None
                and pipeline_accuracy(self.pipeline, self.variants, ch) < self.floor - 1e-12
            ):
                continue
            if any(not self.profiles.has(ch[s], self.plan.models[s].hardware) for s in ch):
                continue
            need = self._resized(d.replicas, batch, ch) if ladder else self._need(d.rate_qps, ch)
            if need is None:
                continue
            cost = self.cost(need)
            if cost < plain - 1e-12:
                options.append((cost, ch, need))
        options.sort(key=lambda o: (o[0], -pipeline_accuracy(self.pipeline, self.variants, o[1])))
        for cost, ch, need in options:
            est = self._estimate(ch, need, batch, rate)
            if est <= self.plan.slo_s:
                return ch, need, cost, est, rate
        return None

    def _adopt(self, choice: Mapping[str, str]) -> None:
        models = dict(self.policy.inputs.models)
        for s, v in choice.items():
            if v != self.choice[s]:
                models[s] = self._model(s, v)
        ladder = self._rewrite_ladder(choice) if self.policy.uses_ladder else ()
        inputs = replace(self.policy.inputs, models=models, ladder=ladder)
        planned_batch = self.policy.planned_batch if ladder else None
        self.choice = dict(choice)
        self.policy = TunerPolicy(inputs, self.policy.planned, self.config, planned_batch)

    def _rewrite_ladder(self, choice: Mapping[str, str]) -> tuple[LadderStep, ...]:
        """The current ladder with the switched stages resized (throughput kept), each step
        re-checked at its rate for the new variants (steps that fail are dropped) and given
        the rate it is proven for with them (bisection, 4 halvings, between its rate and its
        rate times the switched stages' throughput gain)."""
        out: list[LadderStep] = []
        slo = self.plan.slo_s
        for st in self.policy.inputs.ladder:
            batch = {m: c.max_batch_size for m, c in st.models.items()}
            old = {m: c.replicas for m, c in st.models.items()}
            k = self._resized(old, batch, choice)
            if k is None or self._estimate(choice, k, batch, st.rate_qps) > slo:
                continue
            # Without its own rate, a step rewritten for a faster variant keeps the slower
            # one's, and above it the tuner adds replicas the new variant does not need (found
            # simulating a 12x burst: a switch cost more than adding slow replicas).
            rate, hi = st.rate_qps, st.rate_qps * self._speedup(old, k, batch, choice)
            if hi > rate * 1.01:
                rate = largest_feasible(
                    lambda r, k=k, b=batch: self._estimate(choice, k, b, r) <= slo, rate, hi, 4
                )
            models = {
                m: ModelConfig(c.hardware, c.max_batch_size, k[m]) for m, c in st.models.items()
            }
            out.append(LadderStep(rate, models, self.cost(k)))
        # a step another one serves more at no higher cost is dropped, as the ladder does
        out.sort(key=lambda x: (x.rate_qps, x.cost_per_hour))
        keep: list[LadderStep] = []
        for x in out:
            while keep and keep[-1].cost_per_hour >= x.cost_per_hour:
                keep.pop()
            keep.append(x)
        return tuple(keep)

    def _speedup(
        self,
        old: Mapping[str, int],
        new: Mapping[str, int],
        batch: Mapping[str, int],
        choice: Mapping[str, str],
    ) -> float:
        """The largest throughput gain of a switched stage (its new replicas and variant
        against the old): no stage can carry more than this over the step's rate."""
        best = 1.0
        for s, v in choice.items():
            if v == self.choice[s]:
                continue
            hw, b = self.plan.models[s].hardware, batch[s]
            mu_old = self.profiles.throughput(self.choice[s], hw, b)
            best = max(best, new[s] * self.profiles.throughput(v, hw, b) / (old[s] * mu_old))
        return best

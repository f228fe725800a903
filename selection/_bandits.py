"""Built-in selection policies: Exp3, Exp4 (Clipper §3.5, after Auer et al.), epsilon-greedy,
UCB1 and a static policy.

Policies hold only parameters and the injected ``random.Random``; everything learned is in the
``WeightState`` they return, so states can be kept per user or per session.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

from ._policy import (
    MISSING,
    Combined,
    Loss,
    WeightState,
    check_models,
    check_rate,
    combine_votes,
    zero_one_loss,
)

Losses = list[tuple[int, float]]  # (model index, loss) of each observed model
Drops = list[tuple[int, float]]  # (model index, how much its log-weight drops)
Probs = Mapping[str, float]

__all__ = [
    "BUILTIN_POLICIES",
    "UCB1",
    "EpsilonGreedy",
    "Exp3",
    "Exp4",
    "StaticPolicy",
    "make_policy",
]


class _Base:
    name = "base"
    # The service passes MISSING for selected models that did not answer, and the selection
    # probabilities of the query (``selected_p``): see SelectionService.feedback.
    observes_missing = True

    def __init__(
        self,
        models: Sequence[str],
        *,
        loss: Loss = zero_one_loss,
        missing_loss: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.models = check_models(models)
        self.loss = loss
        if not (isinstance(missing_loss, int | float) and 0.0 <= missing_loss <= 1e6):
            raise ValidationError("missing_loss", "a number >= 0", missing_loss)
        self.missing_loss = float(missing_loss)
        self.rng = rng if rng is not None else random.Random(0)

    def init(self) -> WeightState:
        return WeightState.fresh(self.models)

    def state_from_dict(self, d: Mapping[str, Any]) -> WeightState:
        st = WeightState.from_dict(d)
        if st.models != self.models:
            st = _migrated(st, self.models)
        return st

    def combine(self, state: WeightState, x: Any, predictions: Mapping[str, Any]) -> Combined:
        w = state.weights()
        weights = {m: float(w[i]) for i, m in enumerate(state.models)}
        return combine_votes(predictions, weights, self.select_all_for_confidence(state, x))

    def select_all_for_confidence(self, state: WeightState, x: Any) -> list[str]:
        return self.select(state, x)

    def select(self, state: WeightState, x: Any) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        return {"policy": self.name, "models": list(self.models), "missing_loss": self.missing_loss}

    def _counted(
        self, state: WeightState, feedback: Any, predictions: Mapping[str, Any]
    ) -> tuple[Losses, WeightState]:
        """Each observed model's (index, loss), and ``state`` with counts, total losses and the
        step counter updated: the bookkeeping every policy shares."""
        counts = list(state.counts)
        tl = list(state.total_loss)
        losses = []
        for m, y in predictions.items():
            i = state.index(m)
            loss = self.missing_loss if y is MISSING else self.loss(feedback, y)
            counts[i] += 1
            tl[i] += loss
            losses.append((i, loss))
        new = replace(state, counts=tuple(counts), total_loss=tuple(tl), steps=state.steps + 1)
        return losses, new

    def observe(
        self,
        state: WeightState,
        x: Any,
        feedback: Any,
        predictions: Mapping[str, Any],
        selected_p: Mapping[str, float] | None = None,
    ) -> WeightState:
        """Count each observed model's loss (``missing_loss`` for MISSING), then let the
        policy move its weights (``_drops``). ``selected_p``: the probabilities the
        query's models were selected with, for policies whose update needs them."""
        losses, new = self._counted(state, feedback, predictions)
        if not losses and self.empty_is_no_step:
            return state
        drops = self._drops(state, losses, selected_p)
        return new if drops is None else self._shifted(state, new, drops)

    # Exp3 learns nothing from a query whose selected model gave nothing at all to observe.
    empty_is_no_step = False

    def _drops(self, state: WeightState, losses: Losses, sel_p: Probs | None) -> Drops | None:
        """How much each observed model's log-weight drops; None: the policy keeps no weights
        (reference policies choose from counts and losses)."""
        return None

    def _shifted(self, state: WeightState, new: WeightState, drops: Drops) -> WeightState:
        """``new`` with each log-weight ``i`` lowered by its drop, renormalized."""
        lw = list(state.log_weights)
        for i, d in drops:
            lw[i] -= d
        floor: float = getattr(self, "weight_floor", 0.0)
        return replace(new, log_weights=_renormalized(lw, floor))


def _migrated(st: WeightState, models: tuple[str, ...]) -> WeightState:
    """A stored state for another model list (models added or removed since it was learned):
    kept models keep what they learned; a new one starts level with the best (log-weight 0
    after renormalization), so it is tried, and untried by the count-based policies."""
    old = {m: i for i, m in enumerate(st.models)}
    top = max(st.log_weights) if st.log_weights else 0.0

    def pick(seq: Sequence[Any], fresh: Any) -> tuple[Any, ...]:
        return tuple(seq[old[m]] if m in old else fresh for m in models)

    return WeightState(
        models,
        pick(st.log_weights, top),
        pick(st.counts, 0),
        pick(st.total_loss, 0.0),
        st.steps,
    )


def _renormalized(lw: Sequence[float], floor: float) -> tuple[float, ...]:
    """Log-weights shifted so the best is 0 (no underflow), and none below ``ln(floor)``:
    a model that failed keeps a small weight it can climb back from once it recovers
    (tracking, as in Exp3.S / fixed-share; ``floor=0`` is the textbook update)."""
    top = max(lw)
    low = math.log(floor) if floor > 0 else -math.inf
    return tuple(max(v - top, low) for v in lw)


def _check_floor(floor: float) -> float:
    if not 0.0 <= floor < 1.0:
        raise ValidationError("weight_floor", "a number in [0, 1)", floor)
    return float(floor)


class StaticPolicy(_Base):
    """Always the same model (or the same fixed ensemble)."""

    name = "static"

    def __init__(
        self, models: Sequence[str], *, use: Sequence[str] | None = None, **kw: Any
    ) -> None:
        super().__init__(models, **kw)
        self.use = list(use) if use is not None else [self.models[0]]
        for m in self.use:
            if m not in self.models:
                raise ValidationError("use", f"models from {list(self.models)!r}", m)

    def select(self, state: WeightState, x: Any) -> list[str]:
        return list(self.use)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "use": self.use}


class Exp3(_Base):
    """Single-model selection (Clipper's Exp3 policy).

    Selects model i with probability ``p_i = (1-gamma) s_i / sum(s) + gamma / k`` and, after the
    loss L of the selected model is observed, sets ``s_i <- s_i * exp(-eta * L / p_i)``. Clipper
    describes gamma = 0; Auer et al.'s Exp3 mixes in uniform exploration, which is what lets a
    model that failed and recovered win traffic back, so a small gamma is the default; with
    the weight floor (see ``_renormalized``) the recovered model's weight is not buried under
    the losses of its failure.
    """

    name = "exp3"

    def __init__(
        self,
        models: Sequence[str],
        *,
        eta: float = 0.2,
        gamma: float = 0.01,
        weight_floor: float = 1e-3,
        **kw: Any,
    ) -> None:
        super().__init__(models, **kw)
        self.eta = check_rate(eta, "eta")
        self.weight_floor = _check_floor(weight_floor)
        if not 0.0 <= gamma < 1.0:
            raise ValidationError("gamma", "a number in [0, 1)", gamma)
        self.gamma = float(gamma)

    def probabilities(self, state: WeightState) -> np.ndarray:
        k = len(state.models)
        return (1.0 - self.gamma) * state.weights() + self.gamma / k

    def select(self, state: WeightState, x: Any) -> list[str]:
        p = self.probabilities(state)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(p), u * p.sum(), side="right"))
        return [state.models[min(i, len(p) - 1)]]

    def combine(self, state: WeightState, x: Any, predictions: Mapping[str, Any]) -> Combined:
        if not predictions:
            return Combined(None, 0.0, 0, 1)
        y = next(iter(predictions.values()))
        return Combined(y, 1.0, 1, 1)

    def selection_probabilities(self, state: WeightState) -> dict[str, float]:
        p = self.probabilities(state)
        return {m: float(p[i]) for i, m in enumerate(state.models)}

    empty_is_no_step = True

    def _drops(self, state: WeightState, losses: Losses, sel_p: Probs | None) -> Drops | None:
        """The importance weight is the p_i the model was selected with (``sel_p``), not the
        p of a later state when feedback is delayed; the current one when not given."""
        p = self.probabilities(state)

        def p_of(i: int) -> float:
            return float(p[i] if sel_p is None else sel_p.get(state.models[i], p[i]))

        return [(i, self.eta * loss / max(p_of(i), 1e-12)) for i, loss in losses]

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "eta": self.eta,
            "gamma": self.gamma,
            "weight_floor": self.weight_floor,
        }


class Exp4(_Base):
    """Ensemble policy (Clipper's Exp4): query every model, combine by weight, and update each
    model's weight by its own loss, ``s_i <- s_i * exp(-eta * L_i)``.

    Confidence is the fraction of models that agree with the combined output; a model whose
    prediction did not arrive by the deadline counts as not agreeing.
    """

    name = "exp4"

    def __init__(
        self, models: Sequence[str], *, eta: float = 0.3, weight_floor: float = 1e-3, **kw: Any
    ) -> None:
        super().__init__(models, **kw)
        self.eta = check_rate(eta, "eta")
        self.weight_floor = _check_floor(weight_floor)

    def select(self, state: WeightState, x: Any) -> list[str]:
        return list(state.models)

    def _drops(self, state: WeightState, losses: Losses, sel_p: Probs | None) -> Drops | None:
        return [(i, self.eta * loss) for i, loss in losses]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "eta": self.eta, "weight_floor": self.weight_floor}


class EpsilonGreedy(_Base):
    """Reference policy: the model with the lowest mean loss, or a uniform pick with prob. epsilon."""

    name = "epsilon-greedy"

    def __init__(self, models: Sequence[str], *, epsilon: float = 0.1, **kw: Any) -> None:
        super().__init__(models, **kw)
        if not 0.0 <= epsilon <= 1.0:
            raise ValidationError("epsilon", "a number in [0, 1]", epsilon)
        self.epsilon = float(epsilon)

    def select(self, state: WeightState, x: Any) -> list[str]:
        if self.rng.random() < self.epsilon or 0 in state.counts:
            untried = [m for m, c in zip(state.models, state.counts, strict=True) if c == 0]
            pool = untried if untried and self.rng.random() >= self.epsilon else list(state.models)
            return [pool[self.rng.randrange(len(pool))]]
        means = [tl / c for tl, c in zip(state.total_loss, state.counts, strict=True)]
        return [state.models[int(np.argmin(means))]]

    def combine(self, state: WeightState, x: Any, predictions: Mapping[str, Any]) -> Combined:
        return Exp3.combine(self, state, x, predictions)  # type: ignore[arg-type]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "epsilon": self.epsilon}


class UCB1(_Base):
    """Reference policy (Auer et al. 2002): maximize mean reward + sqrt(2 ln n / n_i)."""

    name = "ucb1"

    def select(self, state: WeightState, x: Any) -> list[str]:
        for m, c in zip(state.models, state.counts, strict=True):
            if c == 0:
                return [m]
        n = sum(state.counts)
        scores = [
            1.0 - tl / c + math.sqrt(2.0 * math.log(n) / c)
            for tl, c in zip(state.total_loss, state.counts, strict=True)
        ]
        return [state.models[int(np.argmax(scores))]]

    combine = EpsilonGreedy.combine


BUILTIN_POLICIES: dict[str, type[_Base]] = {
    c.name: c for c in (StaticPolicy, Exp3, Exp4, EpsilonGreedy, UCB1)
}
"""The built-in policies by name; registered through the plugin host by ``selection.plugin``."""


def make_policy(
    config: Mapping[str, Any],
    *,
    rng: random.Random | None = None,
    factories: Mapping[str, Callable[..., Any]] | None = None,
) -> Any:
    """Build a policy from ``{"policy": name, "models": [...], **params}`` (JSON round trip of
    ``policy.config()``).

    ``factories`` is the registry to resolve ``name`` in, normally
    ``PluginHost.selection_policies()`` (built-ins plus every plugin's); the built-ins when
    omitted.
    """
    reg = BUILTIN_POLICIES if factories is None else factories
    cfg = dict(config)
    name = cfg.pop("policy", None)
    if name not in reg:
        raise ValidationError("policy", f"one of {sorted(reg)!r}", name)
    models = cfg.pop("models", None)
    if not isinstance(models, list):
        raise ValidationError("models", "a list of model names", models)
    try:
        return reg[name](models, rng=rng, **cfg)
    except TypeError as e:
        raise ValidationError(f"{name} parameters", "known parameter names", str(e)) from None

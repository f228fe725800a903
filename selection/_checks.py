"""Conformance checks every registered selection policy must pass (``checks`` in docs/design.md).

``check_policy(name, factory)`` runs a short seeded feedback loop and verifies: the inputs and
prediction mappings handed to the policy are left untouched; the same seed gives the same
selections and states; states survive a JSON round trip (``to_dict`` / ``state_from_dict``);
``combine`` returns a ``Combined`` with a confidence in [0, 1], and with a missing prediction
(straggler) says so and caps the confidence at ``contributed / selected``; a malformed state is refused with an ``InferlineError``.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inferline.core.errors import InferlineError

from ._policy import Combined

__all__ = ["check_policy"]


def _loop(
    factory: Callable[..., Any], models: Sequence[str], seed: int, steps: int
) -> tuple[list[list[str]], list[dict[str, Any]], Any, Any]:
    policy = factory(list(models), rng=random.Random(seed))
    rng = np.random.default_rng(seed)
    state = policy.init()
    picks: list[list[str]] = []
    states: list[dict[str, Any]] = []
    for _ in range(steps):
        x = rng.normal(size=4)
        x_copy = x.copy()
        y = int(rng.integers(3))
        chosen = list(policy.select(state, x))
        if not chosen or any(m not in models for m in chosen):
            raise AssertionError(
                f"select returned {chosen!r}, not a non-empty subset of {models!r}"
            )
        preds = {
            m: (y if rng.random() < 0.5 + 0.1 * i else (y + 1) % 3) for i, m in enumerate(chosen)
        }
        preds_copy = copy.deepcopy(preds)
        out = policy.combine(state, x, preds)
        if not isinstance(out, Combined) or not 0.0 <= out.confidence <= 1.0:
            raise AssertionError(
                f"combine returned {out!r}, not a Combined with confidence in [0, 1]"
            )
        if len(chosen) > 1:
            partial = dict(list(preds.items())[:-1])
            part = policy.combine(state, x, partial)
            # a missing model counts as not agreeing: confidence <= contributed / selected
            if (
                part.contributed != len(partial)
                or part.confidence > part.contributed / max(part.selected, 1) + 1e-12
            ):
                raise AssertionError("a missing (straggling) prediction must lower confidence")
        state = policy.observe(state, x, y, preds)
        if preds != preds_copy or not np.array_equal(x, x_copy):
            raise AssertionError("the policy modified its inputs")
        picks.append(chosen)
        states.append(state.to_dict())
    return picks, states, policy, state


def check_policy(
    name: str,
    factory: Callable[..., Any],
    models: Sequence[str] = ("a", "b", "c"),
    *,
    seed: int = 0,
    steps: int = 60,
) -> None:
    """Raise ``AssertionError`` (naming the policy) on the first violated property."""
    try:
        picks1, states1, policy, state = _loop(factory, models, seed, steps)
        picks2, states2, _, _ = _loop(factory, models, seed, steps)
        if picks1 != picks2 or states1 != states2:
            raise AssertionError("the same seed gave different selections or states")
        raw = json.loads(json.dumps(state.to_dict()))
        if policy.state_from_dict(raw) != state:
            raise AssertionError("state does not survive a JSON round trip")
        try:
            policy.state_from_dict({"bogus": 1})
        except InferlineError:
            pass
        else:
            raise AssertionError("a malformed state was accepted")
    except AssertionError as e:
        raise AssertionError(f"selection policy {name!r}: {e}") from None

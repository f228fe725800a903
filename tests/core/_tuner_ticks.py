"""Drive a pure tuner policy tick by tick in tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

TICK_S = 0.1


def run_ticks(
    policy: Any,
    state: Any,
    start_s: float,
    until_s: float,
    peaks: Sequence[int] | Callable[[int], Sequence[int]],
) -> tuple[Any, list[Any]]:
    """Step ``policy`` every 0.1 s after ``start_s`` up to ``until_s`` with the same per-window
    ``peaks`` (or ``peaks(i)`` at the i-th tick); the final state and the decisions made."""
    t, i, decisions = start_s, 0, []
    while t < until_s - 1e-9:
        t = round(t + TICK_S, 10)
        state, d = policy.step(state, t, peaks(i) if callable(peaks) else peaks)
        if d is not None:
            decisions.append(d)
        i += 1
    return state, decisions

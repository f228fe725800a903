"""LinUCB exploration in ``top_k`` pays off: a seeded synthetic bandit where it lowers regret."""

from __future__ import annotations

import asyncio

import numpy as np

from inferline.velox import FeatureTable, TableModel, VeloxConfig, VeloxService

SEEDS = range(20)
N_ITEMS, DIM, ROUNDS, NOISE = 30, 5, 60, 0.5


async def _regret(seed: int, alpha: float) -> float:
    """Cumulative regret of a user served top-1 for ``ROUNDS`` rounds, rewards ``w.f + noise``."""
    rng = np.random.default_rng(seed)
    feats = rng.normal(size=(N_ITEMS, DIM))
    reward = feats @ rng.normal(size=DIM)
    best = float(reward.max())
    ids = list(range(N_ITEMS))
    svc = VeloxService()
    await svc.register(TableModel("m", FeatureTable(ids, feats)), VeloxConfig(ridge_lambda=1.0))
    total = 0.0
    for _ in range(ROUNDS):
        top = await svc.top_k("m", "u", ids, 1, alpha=alpha)
        i = top.items[0].item
        total += best - float(reward[i])
        await svc.observe("m", "u", i, float(reward[i] + NOISE * rng.normal()))
    await svc.close()
    return total


def test_exploration_lowers_average_regret_over_seeds() -> None:
    """Greedy top-1 (alpha=0) locks onto an early good-enough item; LinUCB (alpha=1) finds
    the best one. Observed over seeds 0..19: mean regret ~74 without exploration, ~10 with.

    Catches: the bonus dropped from top_k's ranking (``total = scores`` in
    ``_runtime.top_k``), or ``alpha`` ignored: both arms then regret the same and this fails.
    """

    async def main() -> tuple[float, float]:
        greedy = [await _regret(s, 0.0) for s in SEEDS]
        ucb = [await _regret(s, 1.0) for s in SEEDS]
        return float(np.mean(greedy)), float(np.mean(ucb))

    greedy, ucb = asyncio.run(main())
    # Generous tolerance (observed ratio ~0.14): exploration must at least halve the regret.
    assert ucb < 0.5 * greedy, (greedy, ucb)
    assert greedy > 20.0, (greedy, ucb)  # the greedy arm really does get stuck on this setup

"""A two-model pipeline over the echo backend, for a deployment file."""

from __future__ import annotations

from typing import Any

import numpy as np


async def chain(x: Any, ctx: Any) -> Any:
    h = await ctx.predict("first", x)
    return await ctx.predict("second", h)


def samples() -> list[Any]:
    return [np.linspace(-1, 1, 8) * (i + 1) / 10 for i in range(16)]

"""One-model pipelines and deployments (benchmarks, reliability checks, smoke tests).

``passthrough(model)`` returns ``async def f(x, ctx): return await ctx.predict(model, x)``;
``sleep_deployment`` describes a deployment of the bundled runtime's ``Sleep`` container (a
model busy for a fixed time per batch, which starts in a fraction of a second).
"""

from __future__ import annotations

from typing import Any

__all__ = ["noop_deployment", "passthrough", "sample_vectors", "sleep_deployment"]


def passthrough(model: str = "m") -> Any:
    """A pipeline that sends the query to ``model`` and returns its output."""

    async def pipeline(x: Any, ctx: Any) -> Any:
        return await ctx.predict(model, x)

    pipeline.__qualname__ = f"passthrough_{model}"
    return pipeline


def sleep_deployment(
    *,
    base_s: float = 0.01,
    per_item_s: float = 0.0,
    spin: bool = False,
    slo_ms: float = 1000.0,
    max_queue: int = 1000,
    backend: str = "local://?oversubscribe=1",
    default_output: Any = None,
) -> dict[str, Any]:
    app: dict[str, Any] = {
        "pipeline": "inferline.demo.simple:passthrough",
        "pipeline_params": {"model": "m"},
        "slo_ms": slo_ms,
        "input": {"dtype": "float32", "shape": [None]},
    }
    if default_output is not None:
        app["default_output"] = default_output
    return {
        "format": "inferline.deployment/1",
        "name": "sleep",
        "backend": backend,
        "models": [
            {
                "name": "m",
                "source": "inferline.adapters.local.examples:sleep",
                "params": {"base_s": base_s, "per_item_s": per_item_s, "spin": spin},
            }
        ],
        "apps": {"app": app},
        "sample_inputs": "inferline.demo.simple:sample_vectors",
        "queue": {"max_queue": max_queue, "expire_late": False, "max_retries": 1},
    }


def noop_deployment(backend: str = "local://?oversubscribe=1") -> dict[str, Any]:
    d = sleep_deployment(backend=backend)
    d["name"] = "noop"
    d["models"][0]["source"] = "inferline.adapters.local.examples:noop"
    d["models"][0]["params"] = {}
    return d


def sample_vectors(n: int = 32) -> list[list[float]]:
    return [[float(i), float(i % 7), 0.5] for i in range(n)]

"""The conformance suite (``inferline.adapters.checks``) over the bundled runtime
(``local://``). The TF Serving, Triton and Ray adapters run it in ``integration/`` (they need a
server)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferline.adapters import PluginHost
from inferline.adapters.checks import CHECKS, run_conformance
from inferline.core import ModelSpec, ValidationError


@pytest.mark.timeout(120)
def test_local_backend_conforms() -> None:
    core = min(os.sched_getaffinity(0))
    host = PluginHost.default()
    spec = ModelSpec("double", "inferline.adapters.local.examples:scale", {"factor": 2.0})
    inputs = [np.arange(3, dtype=np.float32) + i for i in range(4)]

    def check(x: np.ndarray, y: np.ndarray) -> None:
        np.testing.assert_allclose(y, x * 2)

    done = asyncio.run(
        run_conformance(
            lambda: host.backend_for(f"local://?oversubscribe=1&cores={core}"),
            spec,
            inputs,
            bad_input="not a number",
            check_output=check,
        )
    )
    assert done == list(CHECKS)


class _Proxy:
    """A backend that forwards everything to a real one, so a test can break one behaviour
    and check that the conformance suite notices (a suite check that cannot fail is none)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _MutedScaleDown(_Proxy):
    """Tells subscribers about replicas that come, never about those that go."""

    def subscribe(self, callback: Any) -> None:
        last: dict[str, int] = {}

        def filtered(model: str, handles: list[Any]) -> None:
            if len(handles) >= last.get(model, 0):
                callback(model, handles)
            last[model] = len(handles)

        self._inner.subscribe(filtered)


class _FailsWholeBatchPerItem(_Proxy):
    """Answers a batch holding a bad input with an error in every slot."""

    def replicas(self, model: str) -> list[Any]:
        return [_SpoilingHandle(h) for h in self._inner.replicas(model)]


class _SpoilingHandle(_Proxy):
    async def predict_batch(self, inputs: Any) -> list[Any]:
        out = await self._inner.predict_batch(inputs)
        if any(isinstance(o, BaseException) for o in out):
            return [next(o for o in out if isinstance(o, BaseException))] * len(out)
        return out


def _run_suite_over(wrap: Any) -> None:
    core = min(os.sched_getaffinity(0))
    host = PluginHost.default()
    spec = ModelSpec("double", "inferline.adapters.local.examples:scale", {"factor": 2.0})
    inputs = [np.arange(3, dtype=np.float32) + i for i in range(4)]
    asyncio.run(
        run_conformance(
            lambda: wrap(host.backend_for(f"local://?oversubscribe=1&cores={core}")),
            spec,
            inputs,
            bad_input="not a number",
        )
    )


@pytest.mark.timeout(120)
def test_the_suite_catches_a_scale_down_subscribers_never_hear_of() -> None:
    """Before, the deploy's earlier (model, 1) event satisfied the scale-down check."""
    with pytest.raises(AssertionError, match="scale-down"):
        _run_suite_over(_MutedScaleDown)


@pytest.mark.timeout(120)
def test_the_suite_catches_good_inputs_failed_by_a_bad_one() -> None:
    """Before, the per-item branch was a bare ``pass``."""
    with pytest.raises(AssertionError, match="good input"):
        _run_suite_over(_FailsWholeBatchPerItem)


def test_the_checks_refuse_too_few_inputs_with_a_named_error() -> None:
    spec = ModelSpec("double", "inferline.adapters.local.examples:scale", {"factor": 2.0})
    with pytest.raises(ValidationError, match="three valid inputs"):
        asyncio.run(run_conformance(lambda: _Proxy(None), spec, [1, 2]))


def test_the_checks_ship_without_pytest() -> None:
    """Third parties call them from any test runner: the module must not need pytest."""
    import inferline.adapters.checks as checks

    src = Path(checks.__file__).read_text()
    assert "pytest" not in src.split('"""', 2)[2]

"""Fixtures for the queue tests; the virtual-time loop itself lives in ``_queueing_vtime``."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from _queueing_vtime import run_virtual


@pytest.fixture
def vrun() -> Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]:
    return run_virtual

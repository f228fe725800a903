"""The independent SimPy model of ``benchmarks/estimator.py``, loaded once for the tests that
check the estimator against it (skipped where simpy is not installed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_NAME = "inferline_bench_estimator"


def simpy_reference() -> ModuleType:
    pytest.importorskip("simpy", reason="simpy (the reference model) is not installed")
    if _NAME not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "estimator.py"
        spec = importlib.util.spec_from_file_location(_NAME, path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = mod
        spec.loader.exec_module(mod)
    return sys.modules[_NAME]

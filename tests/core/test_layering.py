"""The layering of ``core/`` (see its package doc): the formats at the top import none of the
engines, and the engines depend one way, estimator <- planning <- tuner; ``core`` imports no
other part of inferline. Function-level imports count (a lazy import that points the wrong way
is still a dependency)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
# each layer may import only itself and the layers before it ("": the modules at the top)
LAYERS = ("", "estimator", "planning", "tuner")


def _name(path: Path) -> list[str]:
    parts = ["inferline", "core", *path.relative_to(CORE).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _targets(path: Path) -> Iterator[list[str]]:
    """Every module ``path`` imports from, as absolute dotted parts (a ``from . import x``
    also yields ``x``)."""
    mod = _name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod if path.name == "__init__.py" else mod[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            else:
                target = (node.module or "").split(".")
            yield target
            for a in node.names:
                yield [*target, a.name]


def _layer(parts: list[str]) -> str:
    return parts[2] if len(parts) > 2 and parts[2] in LAYERS else ""


MODULES = sorted(CORE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_a_core_module_imports_only_its_layer_and_those_before(path):
    own = LAYERS.index(_layer(_name(path)))
    allowed = set(LAYERS[: own + 1])
    for t in _targets(path):
        if t[0] != "inferline":
            continue
        assert t[:2] == ["inferline", "core"], f"core imports {'.'.join(t)}"
        if path == CORE / "__init__.py":
            continue  # the package re-exports every layer
        assert _layer(t) in allowed, f"{'.'.join(_name(path))} imports {'.'.join(t)}"


def test_the_checker_sees_an_import_against_the_layers(tmp_path, monkeypatch):
    """A lazy import from the estimator into the tuner is reported (else the test above could
    not fail)."""
    bad = CORE / "estimator" / "_simulate.py"
    fake = tmp_path / "core" / "estimator" / "_simulate.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(bad.read_text() + "\n\ndef f():\n    from ..tuner import Tuner\n")
    monkeypatch.setattr(sys.modules[__name__], "CORE", tmp_path / "core")
    with pytest.raises(AssertionError, match=r"imports inferline\.core\.tuner"):
        test_a_core_module_imports_only_its_layer_and_those_before(fake)

"""docs/writing-an-adapter.md shows every hook with the signature of its hookspec."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from inferline.adapters import HOOK_NAMES, hookspecs

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-an-adapter.md"


def _documented() -> dict[str, ast.FunctionDef]:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert blocks, "no python code blocks in the guide"
    out: dict[str, ast.FunctionDef] = {}
    for b in blocks:
        tree = ast.parse(b)  # every block must at least be valid Python
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("inferline_"):
                # the reference block carries annotations; keep the fullest definition
                if node.returns is not None or node.name not in out:
                    out[node.name] = node
    return out


def test_guide_documents_every_hook_with_its_spec_signature() -> None:
    docs = _documented()
    assert set(docs) == set(HOOK_NAMES), set(HOOK_NAMES) ^ set(docs)
    for name in HOOK_NAMES:
        spec = inspect.signature(getattr(hookspecs, name))
        node = docs[name]
        got = [a.arg for a in node.args.args]
        assert got == list(spec.parameters), f"{name}: {got} != {list(spec.parameters)}"
        for a in node.args.args:
            want = spec.parameters[a.arg].annotation
            assert a.annotation is not None and ast.unparse(a.annotation) == want, (name, a.arg)
        assert node.returns is not None and ast.unparse(node.returns) == spec.return_annotation, (
            name
        )


def test_every_hookspec_is_in_hook_names() -> None:
    specs = {n for n, f in vars(hookspecs).items() if n.startswith("inferline_") and callable(f)}
    assert specs == set(HOOK_NAMES)

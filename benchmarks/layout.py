"""The code layout in figures: lines per folder, modules over 600 lines, long functions, the
modules at the top of ``inferline/``, and import cycles between product modules (imports
inside functions and under ``TYPE_CHECKING`` count: a lazy import that hides a cycle is still
one). ``tests/test_layout.py`` holds the rules these figures are checked against.

    python benchmarks/layout.py [--json] [--root CHECKOUT]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# product folders and the package each is installed as (setup.py)
FOLDERS = {
    "inferline": "inferline",
    "core": "inferline.core",
    "queueing": "inferline.queueing",
    "selection": "inferline.selection",
    "velox": "inferline.velox",
    "adapters": "inferline.adapters",
}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# the compiled event loop is one numba function body by necessity
EXEMPT = ("_estimator_kernel.py",)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    lines: int


def modules(root: Path = ROOT) -> dict[str, Module]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for p in sorted((root / folder).rglob("*.py")):
            if "_pb2" in p.name:
                continue  # generated protobuf code
            parts = [pkg, *p.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            out[name] = Module(name, p, len(p.read_text().splitlines()))
    return out


def _targets(mod: str, node: ast.AST, is_pkg: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for a in node.names:
            yield a.name
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = mod.split(".")
            if not is_pkg:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            b = ".".join(base + ([node.module] if node.module else []))
        else:
            b = node.module or ""
        yield b
        for a in node.names:
            yield f"{b}.{a.name}"


def import_graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, info in mods.items():
        tree = ast.parse(info.path.read_text())
        is_pkg = info.path.name == "__init__.py"
        for node in ast.walk(tree):
            for t in _targets(m, node, is_pkg):
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                # a package importing its own submodules (re-exports) is not a cycle edge back
                if t and t != m and not m.startswith(t + "."):
                    edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def long_functions(mods: dict[str, Module]) -> list[tuple[str, str, int]]:
    out = []
    for m, info in mods.items():
        for node in ast.walk(ast.parse(info.path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append((m, node.name, n))
    return sorted(out, key=lambda r: -r[2])


def report(root: Path = ROOT) -> dict[str, object]:
    mods = modules(root)
    edges = import_graph(mods)
    per_folder: dict[str, int] = {}
    for info in mods.values():
        folder = info.path.relative_to(root).parts[0]
        per_folder[folder] = per_folder.get(folder, 0) + info.lines
    top = sorted(p.name for p in (root / "inferline").glob("*.py"))
    return {
        "lines_per_folder": per_folder,
        "modules": len(mods),
        "over_limit": sorted(
            ((i.name, i.lines) for i in mods.values() if i.lines > MAX_MODULE_LINES),
            key=lambda r: -r[1],
        ),
        "exempt": [i.name for i in mods.values() if i.path.name in EXEMPT],
        "long_functions": long_functions(mods),
        "facade_top_modules": top,
        "cycles": cycles(edges),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--smoke", action="store_true", help="no change: the full run takes seconds")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this)")
    args = ap.parse_args()
    r = report(args.root)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    c = Console()
    t = Table(title="lines per folder")
    t.add_column("folder")
    t.add_column("lines", justify="right")
    for k, v in sorted(r["lines_per_folder"].items()):  # type: ignore[attr-defined]
        t.add_row(k, str(v))
    c.print(t)
    print(f"modules: {r['modules']}")
    print(f"modules over {MAX_MODULE_LINES} lines: {r['over_limit'] or 'none'}")
    print(f"exempt (numba kernel): {r['exempt']}")
    longf = r["long_functions"]
    print(f"functions over {MAX_FUNCTION_LINES} lines: {len(longf)}")  # type: ignore[arg-type]
    for m, f, n in longf:  # type: ignore[attr-defined]
        print(f"  {n:4d} {m}.{f}")
    print(f"modules at the top of inferline/: {r['facade_top_modules']}")
    cyc = r["cycles"]
    print(f"import cycles: {len(cyc)}")  # type: ignore[arg-type]
    for comp in cyc:  # type: ignore[attr-defined]
        print("  " + " <-> ".join(comp))
    print("\nreproduce: python benchmarks/layout.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

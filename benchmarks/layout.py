"""The code layout in figures: lines per folder, modules over 600 lines, long functions, the
modules at the top of ``inferline/``, import cycles between product modules and between
packages, imports of another package's private (``_``) modules, the places that construct the
plugin host, a backend and a dispatcher, and the public API sizes (``len(__all__)``). Imports
inside functions and under ``TYPE_CHECKING`` count: a lazy import that hides a cycle is still
one. The figures are printed for the working tree and for a git revision (``--before``, read
from ``git archive``, nothing checked out). ``tests/test_layout.py`` holds the rules these
figures are checked against and imports its checkers from here.

    python benchmarks/layout.py [--before REV] [--json] [--root CHECKOUT]
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
import tarfile
import tempfile
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
# the revision the "before" column is measured on (issue 42's starting point)
BEFORE = "432bbaa8"


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


def _imported_modules(mod: str, node: ast.AST, is_pkg: bool, mods: dict) -> Iterator[str]:
    """The product modules one import statement loads: ``from p import m`` names module
    ``p.m`` when that is a module, else ``p`` itself; ``import a.b.c`` the longest known
    prefix."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base, *names = list(_targets(mod, node, is_pkg))
        subs = [n for n in names if n in mods]
        targets = subs + ([base] if len(subs) < len(names) else [])
    else:
        return
    for t in targets:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t:
            yield t


def import_statements(mods: dict[str, Module]) -> Iterator[tuple[str, int, str]]:
    """(module, line, imported product module) for every import statement, at any depth
    (functions, ``TYPE_CHECKING``)."""
    for m, info in mods.items():
        is_pkg = info.path.name == "__init__.py"
        for node in ast.walk(ast.parse(info.path.read_text())):
            for t in _imported_modules(m, node, is_pkg, mods):
                if t != m:
                    yield m, node.lineno, t  # type: ignore[attr-defined]


def imports(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the product modules it imports (any depth: functions, TYPE_CHECKING)."""
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, _, t in import_statements(mods):
        out[m].add(t)
    return out


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


def package_of(name: str, mods: dict[str, Module]) -> str:
    """The package a module belongs to: itself for a package's ``__init__``."""
    return name if mods[name].path.name == "__init__.py" else name.rpartition(".")[0]


def _private_owner(name: str) -> str | None:
    """The package a private module is private to (``a.b._c.d`` -> ``a.b``), None when no
    part of the name is private."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.startswith("_") and not p.startswith("__"):
            return ".".join(parts[:i])
    return None


def private_imports(mods: dict[str, Module]) -> list[tuple[str, int, str]]:
    """(importer, line, private module) for every import statement that loads another
    package's private module. A
    subpackage is a package of its own, but its parent's internals are shared with it:
    ``adapters.tfserving`` may import ``adapters._ports``, ``server`` may not import
    ``adapters.tfserving._protos``, nor ``core`` ``core.planning._search``."""
    out = []
    for m, line, t in import_statements(mods):
        pkg = package_of(m, mods)
        owner = _private_owner(t)
        if owner is not None and pkg != owner and not pkg.startswith(owner + "."):
            out.append((m, line, t))
    return sorted(set(out))


def top_package(name: str) -> str:
    """The top-level package of a module (``inferline.server.frontdoors._grpc`` ->
    ``inferline.server``); the facade (``inferline``, ``inferline.__main__``) is its own."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] != "__main__" else "inferline"


def package_graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Top-level package -> the top-level packages its modules import."""
    edges: dict[str, set[str]] = {top_package(m): set() for m in mods}
    for m, targets in imports(mods).items():
        for t in targets:
            if top_package(t) != top_package(m):
                edges[top_package(m)].add(top_package(t))
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


def _called(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else ""
        return f"{base}.{f.attr}" if base else f".{f.attr}"
    return ""


def _constructs(called: str) -> str | None:
    if called in ("PluginHost", "PluginHost.default"):
        return "plugin host"
    if called == "Dispatcher":
        return "dispatcher"
    name = called.rpartition(".")[2]
    if name == "backend_for" or (name.endswith("Backend") and name != "Backend"):
        return "backend"
    return None


def constructions(mods: dict[str, Module]) -> dict[str, list[str]]:
    """Where the plugin host (``PluginHost()``, ``PluginHost.default()``), a backend
    (``host.backend_for(url)``, ``LocalBackend(...)``) and a ``Dispatcher`` are built: one
    ``module:line`` per call, outside the adapters package that defines the backends."""
    out: dict[str, list[str]] = {"plugin host": [], "backend": [], "dispatcher": []}
    for m, info in mods.items():
        if m.startswith("inferline.adapters"):
            continue
        for node in ast.walk(ast.parse(info.path.read_text())):
            if isinstance(node, ast.Call) and (kind := _constructs(_called(node))):
                out[kind].append(f"{m}:{node.lineno}")
    return out


def _all_size(tree: ast.Module) -> int | None:
    names: list[str] = []
    found = False
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if not (isinstance(target, ast.Name) and target.id == "__all__"):
                continue
            found = True
            if isinstance(node, ast.Assign | ast.AnnAssign):
                names = []
            try:
                names += list(ast.literal_eval(node.value))  # type: ignore[arg-type]
            except ValueError:
                return None  # computed: see api_sizes
    return len(names) if found else None


def api_sizes(mods: dict[str, Module]) -> dict[str, int]:
    """``len(__all__)`` of every package (``inferline``'s includes its lazy names)."""
    out = {}
    for m, info in mods.items():
        if info.path.name != "__init__.py":
            continue
        tree = ast.parse(info.path.read_text())
        n = _all_size(tree)
        if n is None and m == "inferline":
            n = _facade_size(tree)
        if n is not None:
            out[m] = n
    return dict(sorted(out.items()))


def _facade_size(tree: ast.Module) -> int:
    """``inferline.__all__``: its literal names plus those of ``_LAZY`` and ``_ATTACH``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("__all__", "_LAZY", "_ATTACH"):
                names.update(ast.literal_eval(node.value))
    return len(names)


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
        "package_cycles": cycles(package_graph(mods)),
        "private_imports": private_imports(mods),
        "constructions": constructions(mods),
        "api_sizes": api_sizes(mods),
    }


def report_at(rev: str, root: Path = ROOT) -> dict[str, object] | None:
    """The report on revision ``rev`` of the checkout at ``root`` (``git archive`` into a
    temporary folder, nothing checked out); None when git or the revision is not there."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(root), "archive", rev, *FOLDERS],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                t.extractall(tmp, filter="data")
            else:
                t.extractall(tmp)  # this repository's own archive
        return report(Path(tmp))


def _counted_long(r: dict[str, object]) -> list[tuple[str, str, int]]:
    """The long functions that count: the numba kernel's are exempt."""
    exempt: list[str] = r["exempt"]  # type: ignore[assignment]
    return [row for row in r["long_functions"] if row[0] not in exempt]  # type: ignore[attr-defined]


def _figures(r: dict[str, object]) -> dict[str, object]:
    built: dict[str, list[str]] = r["constructions"]  # type: ignore[assignment]
    rows: dict[str, object] = {
        "cross-package private imports": len(r["private_imports"]),  # type: ignore[arg-type]
        "package-level cycles": len(r["package_cycles"]),  # type: ignore[arg-type]
        "module-level import cycles": len(r["cycles"]),  # type: ignore[arg-type]
        f"functions over {MAX_FUNCTION_LINES} lines (kernel aside)": len(_counted_long(r)),
        **{f"places that build the {k}": len(v) for k, v in built.items()},
        "modules": r["modules"],
    }
    for pkg, n in r["api_sizes"].items():  # type: ignore[attr-defined]
        rows[f"len(__all__) {pkg}"] = n
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--smoke", action="store_true", help="no change: the full run takes seconds")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this)")
    ap.add_argument(
        "--before", default=BEFORE, help=f"git revision of the before column (default {BEFORE})"
    )
    args = ap.parse_args()
    r = report(args.root)
    before = report_at(args.before, args.root)
    if args.json:
        print(json.dumps({**r, "before": before}, indent=1))
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
    print(
        f"functions over {MAX_FUNCTION_LINES} lines: {len(_counted_long(r))} (numba kernel aside)"
    )
    for m, f, n in longf:  # type: ignore[attr-defined]
        print(f"  {n:4d} {m}.{f}")
    print(f"modules at the top of inferline/: {r['facade_top_modules']}")
    cyc = r["cycles"]
    print(f"import cycles: {len(cyc)}")  # type: ignore[arg-type]
    for comp in cyc:  # type: ignore[attr-defined]
        print("  " + " <-> ".join(comp))
    pcyc = r["package_cycles"]
    print(f"package-level cycles: {len(pcyc)}")  # type: ignore[arg-type]
    for comp in pcyc:  # type: ignore[attr-defined]
        print("  " + " <-> ".join(comp))
    priv = r["private_imports"]
    print(f"cross-package private imports: {len(priv)}")  # type: ignore[arg-type]
    for m, line, target in priv:  # type: ignore[attr-defined]
        print(f"  {m}:{line} -> {target}")
    for kind, where in r["constructions"].items():  # type: ignore[attr-defined]
        print(f"places that build the {kind}: {len(where)}  {', '.join(where)}")

    after = _figures(r)
    prior = _figures(before) if before is not None else {}
    t = Table(title=f"layout before ({args.before}) / after (working tree)")
    t.add_column("figure")
    t.add_column("before", justify="right")
    t.add_column("after", justify="right")
    for k in [*prior, *(k for k in after if k not in prior)]:
        t.add_row(k, str(prior.get(k, "-")), str(after.get(k, "-")))
    c.print(t)
    if before is None:
        print(f"(before: revision {args.before} not available here)")
    print(f"\nreproduce: python benchmarks/layout.py --before {args.before}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

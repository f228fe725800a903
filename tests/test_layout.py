"""The layout rules of docs/design.md, checked on the code itself (``benchmarks/layout.py`` prints
the figures and holds the checkers): no import cycle between product modules (function-level
imports included), none between packages (cli -> deploy -> server, measure, queueing,
adapters, selection, velox -> core), no import of another package's private (``_``) module,
no module over 600 lines but the numba kernel, at most six modules at the top of
``inferline/``, and every CLI verb listed by ``inferline --help``. Each import rule has a
self-test: a small tree in ``tmp_path`` on which the checker must report the violation."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _layout():
    spec = importlib.util.spec_from_file_location("_layout", ROOT / "benchmarks" / "layout.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_layout"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycle_between_product_modules():
    r = _layout().report()
    assert r["cycles"] == []


def test_the_checker_sees_a_cycle_hidden_in_a_function(tmp_path):
    """A lazy import still closes a cycle: the checker must report it (else the test above
    could not fail)."""
    lay = _layout()
    for folder in lay.FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "core" / "a.py").write_text("from inferline.core import b\n")
    (tmp_path / "core" / "b.py").write_text("def f():\n    from inferline.core.a import x\n")
    assert lay.report(tmp_path)["cycles"] == [["inferline.core.a", "inferline.core.b"]]


def _tree(tmp_path, files: dict[str, str]):
    lay = _layout()
    for folder in lay.FOLDERS:
        (tmp_path / folder).mkdir()
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return lay.report(tmp_path)


def test_no_import_cycle_between_packages():
    """deploy <-> measure was one (``deploy._drift`` -> ``measure._calibrate``,
    ``measure._attached`` -> ``deploy._attach``): a module-level check cannot see it."""
    assert _layout().report()["package_cycles"] == []


def test_the_checker_sees_a_cycle_between_packages(tmp_path):
    """No module-level cycle, but deploy imports measure and measure (lazily) deploy."""
    r = _tree(
        tmp_path,
        {
            "inferline/deploy/_drift.py": "from inferline.measure import calibrate\n",
            "inferline/deploy/__init__.py": "",
            "inferline/measure/_attached.py": "def f():\n    from inferline.deploy import x\n",
            "inferline/measure/__init__.py": "",
        },
    )
    assert r["cycles"] == []
    assert r["package_cycles"] == [["inferline.deploy", "inferline.measure"]]


def test_no_package_imports_another_packages_private_module():
    """Each package's ``__init__`` exports what the others use; no import reaches past it."""
    assert _layout().report()["private_imports"] == []


def test_the_checker_sees_a_private_import_across_packages(tmp_path):
    """Reported: a private module of another package (in a function, or named as a
    module in ``from p import _m``), and a subpackage's private module from its parent (a
    subpackage is a package of its own). Not reported: a package's own private modules, and
    the parent's private modules from a subpackage (shared with it)."""
    r = _tree(
        tmp_path,
        {
            "adapters/_ports.py": "",
            "adapters/tfserving/__init__.py": "from ._protos import stubs\n",
            "adapters/tfserving/_protos.py": "",
            "adapters/tfserving/_backend.py": "from inferline.adapters._ports import free\n",
            "inferline/server/frontdoors/_grpc.py": (
                "def add():\n    from inferline.adapters.tfserving._protos import stubs\n"
            ),
            "inferline/server/_run.py": "",
            "inferline/deploy/_serve.py": "from inferline.server import _run\n",
            "core/__init__.py": "from .planning._search import search\n",
            "core/planning/_search.py": "",
        },
    )
    assert r["private_imports"] == [
        ("inferline.core", 1, "inferline.core.planning._search"),
        ("inferline.deploy._serve", 1, "inferline.server._run"),
        ("inferline.server.frontdoors._grpc", 2, "inferline.adapters.tfserving._protos"),
    ]


def test_no_module_over_600_lines_but_the_numba_kernel():
    r = _layout().report()
    over = [name for name, _ in r["over_limit"] if name not in r["exempt"]]
    assert over == []


def test_no_function_over_80_lines_but_the_numba_kernel():
    """pluggy and SimPy keep every function to one screen; the kernel is one numba loop."""
    lay = _layout()
    r = lay.report()
    assert lay._counted_long(r) == []


def test_the_checker_sees_a_long_function_and_spares_the_kernel(tmp_path):
    long_body = "".join(f"    x{i} = {i}\n" for i in range(80))  # def + 80 lines: 81
    r = _tree(
        tmp_path,
        {
            "core/_a.py": f"def short():\n{long_body[:-12]}\n\ndef f():\n{long_body}",
            "core/estimator/_estimator_kernel.py": f"def _loop():\n{long_body}",
        },
    )
    lay = _layout()
    assert lay._counted_long(r) == [("inferline.core._a", "f", 81)]
    assert {row[1] for row in r["long_functions"]} == {"f", "_loop"}


def test_one_place_builds_the_plugin_host_backend_and_dispatcher():
    """The composition root builds them: the plugin host and backends in
    ``inferline.deploy._host`` (which ``_build`` and ``Deployment.open_backend`` use), the
    dispatcher in ``inferline.deploy._build``; nothing else constructs them."""
    built = _layout().report()["constructions"]
    assert {m.split(":")[0] for m in built["dispatcher"]} == {"inferline.deploy._build"}
    assert {m.split(":")[0] for m in built["plugin host"]} == {"inferline.deploy._host"}
    assert {m.split(":")[0] for m in built["backend"]} == {"inferline.deploy._host"}
    assert all(len(v) == 1 for v in built.values()), built


def test_at_most_six_modules_at_the_top_of_the_facade():
    assert len(_layout().report()["facade_top_modules"]) <= 6


def test_help_lists_every_verb(capsys):
    from inferline.cli import VERBS, main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for verb in VERBS:
        assert f"\n    {verb}" in out, verb


def test_a_verb_that_does_not_import_fails_loudly(monkeypatch):
    """Before, a verb module whose import failed vanished from --help without a word."""
    import inferline.cli._main as cli_main

    monkeypatch.setattr(cli_main, "VERBS", (*cli_main.VERBS, "no_such_verb"))
    with pytest.raises(ModuleNotFoundError):
        cli_main.build_parser()


def test_the_facade_names_its_lazy_exports_for_type_checkers():
    """Every lazy name is in ``__all__``, imported under ``TYPE_CHECKING`` (so type checkers
    and IDEs see it) from the module ``_LAZY`` loads it from, and resolves at run time."""
    import ast

    import inferline

    tree = ast.parse((ROOT / "inferline" / "__init__.py").read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed.update({a.name: imp.module or "" for a in imp.names})
    assert typed == inferline._LAZY
    assert set(inferline._LAZY) <= set(inferline.__all__)
    for name in inferline.__all__:
        assert getattr(inferline, name) is not None, name

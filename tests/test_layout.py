"""The layout rules of DESIGN.md, checked on the code itself (``benchmarks/layout.py`` prints
the figures): no import cycle between product modules (function-level imports included), no
module over 600 lines but the numba kernel, at most six modules at the top of ``inferline/``,
and every CLI verb listed by ``inferline --help``."""

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


def test_no_module_over_600_lines_but_the_numba_kernel():
    r = _layout().report()
    over = [name for name, _ in r["over_limit"] if name not in r["exempt"]]
    assert over == []


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

"""docs/design.md is the contract the code cites: it is in the repository, the code cites it
(not the ``DESIGN.md`` a clone does not have), and the files it names exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
CITING = ("core", "queueing", "selection", "velox", "adapters", "inferline", "tests", "benchmarks")


def test_code_cites_the_design_in_the_repository() -> None:
    stale = []
    for folder in CITING:
        for p in (ROOT / folder).rglob("*.py"):
            if p == Path(__file__).resolve():
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"(?<![/\w])DESIGN\.md", line):
                    stale.append(f"{p.relative_to(ROOT)}:{i}")
    assert stale == [], stale


def test_the_paths_the_design_names_exist() -> None:
    """Paths in backticks, from the repository root or (for the facade's rooms) ``inferline/``."""
    named = set(
        re.findall(r"`([a-z][\w.-]*/(?:[\w.-]+/)*(?:[\w.-]+\.(?:py|md))?)`", DESIGN.read_text())
    )
    assert len(named) > 20, named
    missing = [
        n
        for n in sorted(named)
        if not (ROOT / n).exists() and not (ROOT / "inferline" / n).exists()
    ]
    assert missing == [], missing

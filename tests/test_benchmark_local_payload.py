"""The payload benchmark runs end to end on a real replica process and prints its table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import local_payload


def test_quick_run_prints_times_and_the_command(capsys):
    assert local_payload.main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines if ln.strip().startswith("(")]
    assert len(rows) == 2  # two shapes, batch 1
    image = next(r for r in rows if r[0].startswith("(224"))
    assert float(image[-3]) == 0.6 and float(image[-2]) > 0 and float(image[-1]) > 0
    assert lines[-1] == "reproduce: .venv/bin/python benchmarks/local_payload.py --quick"


def test_a_request_over_the_message_limit_is_refused_and_named():
    import asyncio

    rows = asyncio.run(local_payload.measure(((1024, 1024, 4),), (8,), 1))
    assert rows[0]["refused"] == "67108864 bytes" and "ms" not in rows[0]

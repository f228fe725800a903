"""Bad snapshots and bad ``inferline detach`` invocations are one-line errors naming the field,
before anything connects (the restores themselves run on a real Triton in
``integration/test_detach_triton.py``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inferline.adapters.triton import restore_snapshot
from inferline.cli import main
from inferline.core import ValidationError


@pytest.mark.parametrize(
    ("snapshot", "field"),
    [
        ({"kind": "tfserving", "models": {}}, "snapshot.kind"),
        ([], "snapshot.kind"),
        ({"kind": "triton", "models": []}, "snapshot.models"),
        ({"kind": "triton", "models": {"m": 3}}, "snapshot.models.m"),
    ],
)
def test_a_bad_snapshot_names_its_field(snapshot: object, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        asyncio.run(restore_snapshot("triton://127.0.0.1:1", snapshot))  # type: ignore[arg-type]
    assert e.value.field == field


def test_detach_usage_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = tmp_path / "s.json"
    snap.write_text(json.dumps({"kind": "triton", "url": "triton://h:1", "models": {}}))
    cases = [
        (["detach"], "--server URL, or BACKEND_URL with --snapshot PATH"),
        (["detach", "triton://127.0.0.1:1"], "--snapshot PATH"),
        (["detach", "tfserving://127.0.0.1:1", "--snapshot", str(snap)], "a triton:// URL"),
        (["detach", "--server", "http://127.0.0.1:1", "--snapshot", str(snap)], "--server"),
        (
            ["detach", "triton://127.0.0.1:1", "--snapshot", str(tmp_path / "none.json")],
            "none.json",
        ),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert snap.exists()  # nothing was restored, so the snapshot is not spent

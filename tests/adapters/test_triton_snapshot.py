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


def test_a_fleet_snapshot_is_restored_member_by_member_from_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inferline attach URL URL`` writes one snapshot per server (kind ``fleet``): detach with
    any member's URL restores every member at the URL its own snapshot recorded, and a URL
    that is not a member (the wrong file at hand) is refused before anything connects."""
    members = [
        {"kind": "triton", "url": "triton://127.0.0.1:1", "models": {}},
        {"kind": "tfserving", "url": "tfserving://127.0.0.1:2", "servers": []},
    ]
    snap = tmp_path / "fleet.json"
    snap.write_text(json.dumps({"kind": "fleet", "url": "[...]", "members": members}))
    assert main(["detach", "triton://127.0.0.1:9", "--snapshot", str(snap)]) == 2
    err = capsys.readouterr().err.strip()
    assert "one of the fleet's servers" in err and "triton://127.0.0.1:1" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "fleet", "members": [{"kind": "ray", "url": "r://x"}]}))
    assert main(["detach", "r://x", "--snapshot", str(bad)]) == 2
    assert "members[0]: kind" in capsys.readouterr().err
    assert snap.exists() and bad.exists()

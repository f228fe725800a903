"""Version directories inferline adds under a model's base path, and taking them away again.

TF Serving reads a version's ``batching_params.pbtxt`` only when that version loads (with
``--enable_per_model_batching_parameters``; a config reload alone does not re-read it, TF
Serving #2008). So the steer path changes a model's batching by adding a NEW version directory:
a copy of the served version (files hard-linked where the file system allows, copied
otherwise) with the new ``batching_params.pbtxt``, and a marker file (``MARKER``) that says
inferline made it and from which version. Only directories with that marker are ever removed,
so the operator's versions are never touched.

The base path must be a directory this process can write, on the file system the servers read
(``gs://`` and other remote paths are refused with ``ValidationError``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferline.core import ValidationError

from ._batching import BATCHING_PARAMS
from ._config import ServedModel

__all__ = [
    "MARKER",
    "added_versions",
    "local_root",
    "local_root_or_none",
    "make_version",
    "operator_versions",
    "remove_added",
    "staged_entry",
]

MARKER = "inferline_version.json"
_FORMAT = "inferline-tfserving-version"


def local_root(entry: ServedModel, where: str) -> Path:
    """The entry's base path as a local directory (``ValidationError`` naming ``where``)."""
    bp = entry.base_path
    if "://" in bp:
        raise ValidationError(
            where, "a local model directory (remote base paths are not written)", bp
        )
    root = Path(bp)
    if not root.is_dir() or not os.access(root, os.W_OK):
        raise ValidationError(where, "a model directory this process can write", bp)
    return root


def local_root_or_none(entry: ServedModel) -> Path | None:
    """The entry's base path where it is a local directory, else None."""
    if "://" in entry.base_path:
        return None
    root = Path(entry.base_path)
    return root if root.is_dir() else None


def _versions(root: Path) -> list[int]:
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def added_versions(root: Path) -> list[int]:
    """The versions under ``root`` inferline made (their directories hold ``MARKER``)."""
    return [v for v in _versions(root) if (root / str(v) / MARKER).is_file()]


def operator_versions(root: Path) -> list[int]:
    """The versions under ``root`` inferline did not make."""
    added = set(added_versions(root))
    return [v for v in _versions(root) if v not in added]


def _link_tree(src: Path, dst: Path) -> None:
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:  # another file system, or links not allowed: a copy
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def make_version(root: Path, source: int, text: str, model: str) -> int:
    """A new version directory under ``root``: version ``source``'s files with
    ``batching_params.pbtxt`` replaced by ``text``; its number (one past the highest)."""
    new = max(_versions(root), default=0) + 1
    tmp = (
        root / f".inferline-{new}.tmp"
    )  # not a version until renamed: a poller never sees it half-made
    if tmp.exists():
        shutil.rmtree(tmp)
    _link_tree(root / str(source), tmp)
    params = tmp / BATCHING_PARAMS
    if params.exists():
        params.unlink()  # a hard link: writing through it would change the source version
    params.write_text(text)
    marker = tmp / MARKER
    if marker.exists():
        marker.unlink()
    marker.write_text(
        json.dumps({"format": _FORMAT, "model": model, "from_version": source}, sort_keys=True)
    )
    tmp.rename(root / str(new))
    return new


def remove_added(root: Path, versions: Sequence[int] | None = None) -> list[int]:
    """Remove the directories inferline made under ``root`` (all, or those of
    ``versions``); the versions removed."""
    gone = []
    for v in added_versions(root):
        if versions is None or v in versions:
            shutil.rmtree(root / str(v))
            gone.append(v)
    return gone


def staged_entry(entry: ServedModel, serving: Sequence[int]) -> ServedModel | None:
    """The step before putting the operator's ``entry`` back: a ``specific`` policy holding
    both the versions it serves among the operator's own directories and those now served
    (``serving``), so the operator's versions are AVAILABLE before inferline's directories
    go. None where nothing of inferline's is under the entry's base path."""
    root = local_root_or_none(entry)
    if root is None or not added_versions(root):
        return None
    kind, arg = entry.policy
    own = operator_versions(root)
    if kind == "specific":
        chosen = [v for v in own if v in arg]
    elif kind == "all":
        chosen = own
    else:
        chosen = own[-int(arg) :]
    versions = tuple(sorted({*chosen, *serving}))
    return ServedModel(entry.name, entry.base_path, entry.platform, versions or None)


def marker_of(d: Path) -> dict[str, Any] | None:
    try:
        return json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return None

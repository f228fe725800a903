"""Answers as protocol tensors, one rule on every door: per-query outputs become named batched
tensors, and what they are (names, dtypes, per-query shapes) is what a door declares.

**A ``None`` output is left out.** An output field that is ``None`` in every row of an answer
(the bundled ``sleep`` model's ``"x"`` for an array input, or an app answering ``None``) is
not a tensor: it is left out of the KServe v2 (HTTP and gRPC) and TF Serving (REST and gRPC)
responses, and out of the outputs a door declares. KServe v2 clients read the outputs a
response has (tritonclient's ``as_numpy`` answers ``None`` for one it lacks) and
perf_analyzer asks for the declared ones; an empty ``BYTES`` tensor instead would be a value
(``""`` per row) the app never returned. A field ``None`` in some rows and not others has no
tensor form and is refused, as are objects other than strings and bytes (before, gRPC failed
with ``cannot convert 'NoneType' object to bytes``, KServe HTTP answered ``null`` and TF
Serving REST the string ``"None"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferline.core import ValidationError

__all__ = ["columns", "merge_shapes", "per_query", "stack_column"]


def columns(outs: Sequence[Any], single: str) -> dict[str, list[Any]]:
    """Per-query outputs as named columns: a dict's keys, else one column named ``single``."""
    first = outs[0] if outs else None
    if isinstance(first, Mapping):
        keys = list(first)
        for i, o in enumerate(outs):
            if not isinstance(o, Mapping) or set(o) != set(keys):
                got = sorted(o) if isinstance(o, Mapping) else type(o).__name__
                raise ValidationError(f"outputs[{i}]", f"a dict with the keys {keys}", got)
        return {str(k): [o[k] for o in outs] for k in keys}
    return {single: list(outs)}


def stack_column(k: str, vals: Sequence[Any], want: tuple[int, ...] | None) -> np.ndarray | None:
    """One column as a batched tensor (``want``: the declared per-query shape, if any); None
    when every value is None (the rule above)."""
    nones = sum(v is None for v in vals)
    if vals and nones == len(vals):
        return None
    if nones:
        raise ValidationError(
            f"outputs.{k}",
            "a value in every row, or None in every row (then left out)",
            f"None in {nones} of {len(vals)} rows",
        )
    rows = [np.asarray(v) for v in vals]
    try:
        arr = np.stack(rows)
    except ValueError as e:
        raise ValidationError(
            f"outputs.{k}", "outputs of one shape across the batch", str(e)
        ) from None
    if arr.dtype.kind in "OSU" and (
        any(r.dtype.kind not in "OSU" for r in rows)
        or not all(isinstance(x, str | bytes) for x in arr.reshape(-1).tolist())
    ):
        # numpy makes [3, "s"] strings ("3"), and bytes(3) is three zero bytes
        raise ValidationError(
            f"outputs.{k}", "numbers, booleans, strings or bytes, one kind in every row", "mixed"
        )
    # the declared shape: a model's [1] output reaches pipelines as a scalar (a label), but a
    # client of the model's route expects the model's [n, 1]
    if (
        want is not None
        and all(d >= 0 for d in want)
        and arr.shape[1:] != want
        and math.prod(arr.shape[1:]) == math.prod(want)
    ):
        arr = arr.reshape((arr.shape[0], *want))
    return arr


def per_query(outs: Sequence[Any], single: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What ``outs`` (one answer per query, shapes may differ between queries) declare: per
    column its dtype name and per-query shape, -1 where queries differ; columns that are None
    everywhere are left out. A column whose dtype or rank differs between queries is declared
    with its first dtype and shape ``[-1]``."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for k, vals in columns(outs, single).items():
        arrs = [np.asarray(v) for v in vals if v is not None]
        if not arrs:
            continue
        dtypes = {_dtype_name(a) for a in arrs}
        shape = merge_shapes([a.shape for a in arrs])
        found[k] = (_dtype_name(arrs[0]), shape if len(dtypes) == 1 else (-1,))
    return found


def merge_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """One per-query shape for ``shapes``: sizes that differ become -1; ranks that differ
    give ``(-1,)``."""
    if len({len(s) for s in shapes}) != 1:
        return (-1,)
    return tuple(d[0] if len(set(d)) == 1 else -1 for d in zip(*shapes, strict=True))


def _dtype_name(a: np.ndarray) -> str:
    return "object" if a.dtype.kind in "OSU" else a.dtype.name

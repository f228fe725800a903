"""Input decoding: an app's ``InputSpec`` and the check of one input's JSON form against it.

The frontend checks inputs before anything is queued, so a wrong type or shape is a 422
naming the field instead of an error deep inside a replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import ValidationError, cast_exact, value_from_json

__all__ = ["InputSpec", "brief", "decode_input"]


@dataclass(frozen=True)
class InputSpec:
    """What an app accepts: a numeric array of a dtype and shape (``None`` = any length).

    The frontend checks inputs against it before anything is queued, so a wrong type or
    shape is a 422 naming the field instead of an error deep inside a replica.
    """

    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "input") -> InputSpec:
        if not isinstance(d, Mapping):
            raise ValidationError(where, "an object with dtype and shape", d)
        extra = set(d) - {"dtype", "shape"}
        if extra:
            raise ValidationError(where, "only keys dtype and shape", sorted(extra))
        dtype = d.get("dtype", "float32")
        try:
            np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValidationError(f"{where}.dtype", "a numpy dtype name", dtype) from None
        shape = d.get("shape")
        if shape is not None:
            if not isinstance(shape, list | tuple) or not all(
                s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 0)
                for s in shape
            ):
                raise ValidationError(f"{where}.shape", "a list of sizes or nulls", shape)
            shape = tuple(shape)
        return cls(str(dtype), shape)

    def describe(self) -> str:
        if self.shape is None:
            return f"an array of {self.dtype}"
        dims = ", ".join("*" if s is None else str(s) for s in self.shape)
        return f"an array of {self.dtype} with shape ({dims}{',' if len(self.shape) == 1 else ''})"

    def check(self, value: Any, field: str, *, non_numbers: bool = True) -> np.ndarray:
        """``value`` (a nested list, or an array from the wire codec) as an array, or raise.

        JSON ``true``/``false`` and strings are not numbers (numpy would read them as 1 and 0,
        and parse ``"1.5"``); ``non_numbers`` False tells that the request held none, which
        spares the walk over the list."""
        if isinstance(value, np.ndarray):
            arr = self._from_array(value, field)
        else:
            arr = self._from_list(value, field, non_numbers)
        if self.shape is not None:
            ok = arr.ndim == len(self.shape) and all(
                want is None or want == got
                for want, got in zip(self.shape, arr.shape, strict=False)
            )
            if not ok:
                raise ValidationError(field, self.describe(), f"shape {tuple(arr.shape)}")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValidationError(field, f"{self.describe()} of finite numbers", "NaN or inf")
        return arr

    def _from_array(self, arr: np.ndarray, field: str) -> np.ndarray:
        kind = np.dtype(self.dtype).kind
        if arr.dtype.kind not in "biuf" or (kind in "iu" and arr.dtype.kind == "f"):
            raise ValidationError(field, self.describe(), f"an array of {arr.dtype}")
        return cast_exact(arr, self.dtype, field)  # astype would wrap 1000 into int8

    def _from_list(self, value: Any, field: str, non_numbers: bool) -> np.ndarray:
        kind = np.dtype(self.dtype).kind
        if not isinstance(value, list):
            raise ValidationError(field, self.describe(), brief(value))
        try:
            arr = np.asarray(value, dtype=self.dtype)
        except (TypeError, ValueError, OverflowError):
            raise ValidationError(field, self.describe(), brief(value)) from None
        if kind in "iu" and not _all_ints(value):
            raise ValidationError(field, self.describe(), "non-integer numbers")
        if kind in "fc" and non_numbers and _any_non_number(value):
            raise ValidationError(field, self.describe(), "true/false or strings (not numbers)")
        return arr


def decode_input(
    spec: InputSpec | None,
    value: Any,
    field: str,
    *,
    plain: bool = False,
    non_numbers: bool = True,
) -> Any:
    """Decode the JSON form of an input and check it against ``spec`` (None: any value).

    ``plain``: the caller knows the JSON held no object besides the request itself, so
    there is no tagged value (array, bytes) to decode. ``non_numbers``: False when the caller
    knows the JSON held no ``true``/``false`` and no string besides its keys.
    """
    if spec is not None:
        if isinstance(value, dict):
            value = value_from_json(value, field)
        return spec.check(value, field, non_numbers=non_numbers)
    if plain:
        return value
    return value_from_json(value, field)


def _all_ints(v: Any) -> bool:
    if isinstance(v, list):
        return all(_all_ints(x) for x in v)
    return isinstance(v, int) and not isinstance(v, bool)


def _any_non_number(v: Any) -> bool:
    if isinstance(v, list):
        return any(_any_non_number(x) for x in v)
    return isinstance(v, bool | str)


def brief(v: Any) -> Any:
    """``v`` itself when short (the error message reprs it), else a truncated repr."""
    r = repr(v)
    return v if len(r) <= 60 else r[:57] + "..."

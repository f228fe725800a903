"""What may cross the Ray hop: the same values as ``local://``'s wire, as they are.

Ray carries numpy arrays natively (no copy into a message), so values are not converted to
the wire's dict form; they are only *checked* against it (``inferline.core.encode_value``'s
rules: numpy arrays and scalars of numeric, bool or string dtypes, str, bytes, JSON-able values,
lists and dicts of those), so a deployment behaves the same on ``local://`` and ``ray://``: an
input without a wire form is a ``ValidationError`` in its slot, an output without one (or an
exception) comes back as an error value in its slot. Errors cross as the wire's error dicts
(``encode_error`` / ``decode_error``), never as pickled exceptions.

Arrays that Ray hands over are read-only views of its object store; ``writable`` copies those,
so containers and callers get writable arrays as they do from ``local://``.

``payload_bytes`` sizes a batch for the choice of path (the replica's gRPC port below
``object_store_min_bytes``, Ray's object store at or above it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferline.core import ValidationError, decode_error, encode_error, encode_value

__all__ = [
    "check_value",
    "pack_outputs",
    "payload_bytes",
    "split_inputs",
    "unpack_outputs",
    "writable",
]

_SCALARS = (str, bytes, bool, int, float, type(None))


def check_value(v: Any) -> None:
    """Raise ``ValidationError`` if ``v`` has no wire form (cheap for arrays: dtype only)."""
    if isinstance(v, _SCALARS):
        return
    if isinstance(v, np.ndarray):
        encode_value(np.empty(0, dtype=v.dtype))  # the dtype rule, without copying the data
        return
    encode_value(v)


def payload_bytes(values: Sequence[Any], limit: int) -> int:
    """About how many bytes ``values`` carry: array data, string and bytes lengths, 8 per
    other scalar, lists and dicts summed. Stops counting once past ``limit`` (the caller only
    asks which side of it a batch is on), so a huge nested input costs little."""
    total = 0
    stack: list[Any] = list(values)
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, str | bytes | bytearray):
            total += len(v)
        elif isinstance(v, dict):
            total += 8 * len(v)
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        else:
            total += 8
    return total


def writable(v: Any) -> Any:
    """``v``, with a read-only top-level array replaced by a writable copy."""
    if isinstance(v, np.ndarray) and not v.flags.writeable:
        return v.copy()
    return v


def split_inputs(inputs: Sequence[Any]) -> tuple[list[Any], dict[int, ValidationError]]:
    """The inputs that may be sent, and a ``ValidationError`` per index that may not."""
    good: list[Any] = []
    bad: dict[int, ValidationError] = {}
    for i, x in enumerate(inputs):
        try:
            check_value(x)
        except ValidationError as e:
            bad[i] = ValidationError(f"inputs[{i}]", e.expected, e.got)
        else:
            good.append(x)
    return good, bad


def pack_outputs(outs: Sequence[Any]) -> tuple[list[Any], dict[int, dict[str, Any]]]:
    """(values, error dicts by index) for a container's outputs; used inside the actor."""
    values: list[Any] = []
    errors: dict[int, dict[str, Any]] = {}
    for i, o in enumerate(outs):
        if isinstance(o, BaseException):
            errors[i] = encode_error(o)
            values.append(None)
            continue
        try:
            check_value(o)
        except ValidationError as e:
            errors[i] = encode_error(ValidationError(f"outputs[{i}]", e.expected, e.got))
            values.append(None)
        else:
            values.append(o)
    return values, errors


def unpack_outputs(values: Sequence[Any], errors: dict[int, dict[str, Any]]) -> list[Any]:
    """One output or ``InferlineError`` per slot, arrays writable; used by the handle."""
    out: list[Any] = []
    for i, v in enumerate(values):
        e = errors.get(i)
        out.append(decode_error(e, f"outputs[{i}]") if e is not None else writable(v))
    return out

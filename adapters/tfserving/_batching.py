"""TF Serving's ``BatchingParameters`` in text form: the ``batching_params.pbtxt`` a version
directory carries (read when that version loads, with ``--enable_per_model_batching_parameters``)
and the server's ``--batching_parameters_file``.

``BatchingParameters`` (tensorflow_serving/servables/tensorflow/session_bundle_config.proto) is
not among the modules ``tensorflow-serving-api`` generates, so its few fields are written and
read here: the wrapped integers (``max_batch_size { value: 8 }``) and the repeated
``allowed_batch_sizes: 4``. ``batching_text`` is the one writer (``inferline export --to
tfserving`` and the steer path write the same text); ``parse_batching_text`` reads the fields
the batcher uses and ignores the others (``pad_variable_length_inputs``, ``thread_pool_name``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferline.core import TFServingBatcher, ValidationError

from ._config import _parse_block, _tokens

__all__ = [
    "BATCHING_FIELDS",
    "BATCHING_PARAMS",
    "batching_text",
    "parse_batching_text",
    "parse_config_block",
]

BATCHING_PARAMS = "batching_params.pbtxt"  # the name TF Serving looks for in a SavedModel
# the wrapped (``google.protobuf.Int64Value``) fields the batcher uses, in the order written
BATCHING_FIELDS = (
    "max_batch_size",
    "batch_timeout_micros",
    "num_batch_threads",
    "max_enqueued_batches",
)


def batching_text(batcher: TFServingBatcher | Mapping[str, Any], head: str = "") -> str:
    """The ``BatchingParameters`` text of a batcher (``TFServingBatcher`` or its ``to_dict()``
    document, checked), after ``head`` (comment lines)."""
    b = batcher if isinstance(batcher, TFServingBatcher) else TFServingBatcher.from_dict(batcher)
    d = b.to_dict()
    text = head + "".join(f"{f} {{ value: {int(d[f])} }}\n" for f in BATCHING_FIELDS)
    return text + "".join(f"allowed_batch_sizes: {n}\n" for n in b.allowed_batch_sizes)


def _int(v: Any, where: str) -> int:
    try:
        return int(str(v), 0)
    except ValueError:
        raise ValidationError(where, "an integer", v) from None


def parse_config_block(text: str) -> dict[str, Any]:
    """Any protobuf text message as ``{field: [values]}`` (a sub-message a dict of the same
    kind, a scalar its token text), for the few fields a caller reads."""
    msg, _ = _parse_block(_tokens(text), 0, None)
    return msg


def parse_batching_text(text: str, where: str = "batching parameters") -> dict[str, Any]:
    """The fields of ``BatchingParameters`` text the batcher uses: the wrapped integers that
    are set, and ``allowed_batch_sizes`` (a list, possibly empty)."""
    try:
        msg = parse_config_block(text)
    except ValidationError as e:
        raise ValidationError(where, "BatchingParameters in protobuf text format", e.got) from None
    out: dict[str, Any] = {}
    for f in BATCHING_FIELDS:
        vals = msg.get(f)
        if not vals:
            continue
        v = vals[-1]
        if not isinstance(v, dict) or not v.get("value"):
            raise ValidationError(f"{where}.{f}", "{ value: N }", v)
        out[f] = _int(v["value"][-1], f"{where}.{f}")
    out["allowed_batch_sizes"] = [
        _int(v, f"{where}.allowed_batch_sizes[{k}]")
        for k, v in enumerate(msg.get("allowed_batch_sizes", []))
    ]
    return out

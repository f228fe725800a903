"""Wire forms (core/_wire): round trips and malformed input."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferline.core import (
    BackendError,
    DeadlineExceededError,
    NotFoundError,
    OverloadedError,
    ValidationError,
    decode_value,
    dumps_value,
    encode_value,
    loads_value,
    value_from_json,
    value_to_json,
)

DTYPES = st.sampled_from(
    ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32",
     "float64", "complex64", ">i4", ">f8", "<U3", "S4"]
)  # fmt: skip

arrays = DTYPES.flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype.newbyteorder("=") != b.dtype.newbyteorder("="):
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


@settings(max_examples=150, deadline=None)
@given(arrays)
def test_array_round_trips_through_every_form(a: np.ndarray) -> None:
    for back in (decode_value(encode_value(a)), loads_value(dumps_value(a))):
        assert isinstance(back, np.ndarray)
        assert same_array(a, back), (a, back)
        assert back.flags.writeable
    j = value_to_json(a)
    assert json.loads(json.dumps(j)) == j  # really JSON
    assert same_array(a, value_from_json(j))


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_json_values_round_trip(v: object) -> None:
    assert decode_value(encode_value(v)) == v
    assert loads_value(dumps_value(v)) == v
    assert value_from_json(json.loads(json.dumps(value_to_json(v)))) == v


@settings(max_examples=100, deadline=None)
@given(st.text(), st.binary())
def test_str_and_bytes_round_trip(s: str, b: bytes) -> None:
    for v in (s, b, [s, b], {"s": s, "b": b}):
        assert decode_value(encode_value(v)) == v
        assert loads_value(dumps_value(v)) == v
    assert value_from_json(value_to_json(b)) == b


def test_nested_containers_with_tensors_and_numpy_scalars() -> None:
    v = {
        "label": np.int64(3),
        "scores": np.linspace(0, 1, 5, dtype=np.float32),
        "tags": ["a", b"b"],
    }
    for back in (decode_value(encode_value(v)), loads_value(dumps_value(v))):
        assert back["label"] == 3 and isinstance(back["label"], np.int64)
        np.testing.assert_array_equal(back["scores"], v["scores"])
        assert back["tags"] == ["a", b"b"]
    j = value_to_json(v)
    assert j["label"] == 3 and j["scores"]["dtype"] == "float32" and j["scores"]["shape"] == [5]


def test_errors_cross_as_named_values_never_pickles() -> None:
    cases = [
        ValidationError("x", "an int", "s"),
        NotFoundError("model", "m", ["a"]),
        DeadlineExceededError("m", 0.25),
        OverloadedError("m", 10),
    ]
    for e in cases:
        back = decode_value(encode_value(e))
        assert type(back) is type(e) and str(back) == str(e)
    back = decode_value(encode_value(RuntimeError("boom")))
    assert isinstance(back, BackendError)
    assert back.error_type == "RuntimeError" and "boom" in str(back)
    assert value_to_json(RuntimeError("boom")) == {
        "error": {"type": "RuntimeError", "message": "boom"}
    }


def test_json_form_accepts_plain_lists_and_data_arrays() -> None:
    assert value_from_json([[1, 2], [3, 4]]) == [[1, 2], [3, 4]]
    a = value_from_json({"dtype": "float32", "shape": [2, 2], "data": [[1, 2], [3, 4]]})
    assert a.dtype == np.float32 and a.shape == (2, 2)
    b64 = base64.b64encode(np.ones(4, np.float32).tobytes()).decode()
    assert value_from_json({"dtype": "float32", "shape": [4], "b64": b64}).sum() == 4
    assert math.isclose(value_to_json(np.float32(1.5)), 1.5)


@pytest.mark.parametrize(
    ("form", "field"),
    [
        (
            {"dtype": "float32", "shape": [3], "b64": base64.b64encode(b"12345").decode()},
            "input.data",
        ),
        ({"dtype": "object", "shape": [1], "b64": ""}, "input.dtype"),
        ({"dtype": "nonsense", "shape": [1], "b64": ""}, "input.dtype"),
        ({"dtype": "float32", "shape": [-1], "b64": ""}, "input.shape"),
        ({"dtype": "float32", "shape": "3", "b64": ""}, "input.shape"),
        ({"dtype": "float32", "b64": ""}, "input.shape"),
        ({"dtype": "float32", "shape": [2], "b64": "***"}, "input.b64"),
        ({"dtype": "int8", "data": [[1], [2, 3]]}, "input.data"),
        ({"dtype": "int8", "shape": [3], "data": [1, 2]}, "input.shape"),
        ({"dtype": "int8", "data": [1], "extra": 1}, "input"),
        ({"bytes_b64": 5}, "input.bytes_b64"),
    ],
)
def test_malformed_json_forms_name_the_field(form: dict, field: str) -> None:
    with pytest.raises(ValidationError) as ei:
        value_from_json(form)
    assert ei.value.field == field


def test_nested_malformed_field_path() -> None:
    with pytest.raises(ValidationError) as ei:
        value_from_json({"a": [0, {"dtype": "float32", "shape": [1], "b64": ""}]})
    assert ei.value.field == "input.a[1].data"


@pytest.mark.parametrize(
    ("d", "field"),
    [
        ({"kind": "tensor", "dtype": "float64", "shape": [2], "data": b"\x00" * 15}, "value.data"),
        ({"kind": "tensor", "dtype": "O", "shape": [1], "data": b"\x00" * 8}, "value.dtype"),
        ({"kind": "tensor", "dtype": "float64", "shape": [2], "data": "text"}, "value.data"),
        ({"kind": "str", "value": b"x"}, "value.value"),
        ({"kind": "json", "value": "{nope"}, "value.value"),
        ({"kind": "list", "items": [{"kind": "wat"}]}, "value[0].kind"),
        ({"kind": "map", "entries": {"k": {"kind": "bytes", "value": 3}}}, "value.k.value"),
        ({"kind": "error", "type": "", "message": ""}, "value.type"),
        ({"nokind": 1}, "value.kind"),
    ],
)
def test_malformed_dict_forms_name_the_field(d: dict, field: str) -> None:
    with pytest.raises(ValidationError) as ei:
        decode_value(d)
    assert ei.value.field == field


def test_unencodable_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        encode_value(object())
    with pytest.raises(ValidationError):
        encode_value(np.array([object()]))
    with pytest.raises(ValidationError):
        encode_value({1: "non-string key"})


def test_bytes_form_rejects_truncated_and_foreign_frames() -> None:
    blob = dumps_value({"a": np.arange(10)})
    for bad in (blob[:-1], blob + b"x", b"PKL\x00" + blob[4:], b""):
        with pytest.raises(ValidationError):
            loads_value(bad)

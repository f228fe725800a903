"""TF Serving adapter pieces without a server: model-set text form, tensors, URLs."""

from __future__ import annotations

import numpy as np
import pytest

from inferline.adapters.tfserving import (
    ServedModel,
    TFServingBackend,
    format_text,
    grpc_available,
    parse_text,
)
from inferline.core import ValidationError

CONFIG = """
# written by an operator
model_config_list {
  config {
    name: 'resnet'
    base_path: "/models/resnet"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 3 } }
  }
  config { name: "bert" base_path: "/models/bert" model_version_policy: { latest { num_versions: 1 } } }
}
"""


def test_model_set_text_parse_and_round_trip() -> None:
    ms = parse_text(CONFIG)
    assert ms == [
        ServedModel("resnet", "/models/resnet", "tensorflow", (1, 3)),
        ServedModel("bert", "/models/bert", latest=1),
    ]
    assert parse_text(format_text(ms)) == ms
    for m in ms:
        assert ServedModel.from_dict(m.to_dict()) == m
    with pytest.raises(ValidationError):
        parse_text("model_config_list { config { name: 'a' base_path: '/a' }")
    with pytest.raises(ValidationError, match="unique"):
        parse_text(format_text([ServedModel("a", "/a"), ServedModel("a", "/b")]))


@pytest.mark.skipif(not grpc_available(), reason="tensorflow-serving-api not installed")
def test_tensor_protos_round_trip() -> None:
    from inferline.adapters.tfserving._protos import from_tensor_proto, stubs, to_tensor_proto

    st = stubs()
    for a in (
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([1, -2], np.int64),
        np.array([True, False]),
    ):
        b = from_tensor_proto(to_tensor_proto(a, st))
        assert b.dtype == a.dtype and np.array_equal(a, b)
    s = from_tensor_proto(to_tensor_proto(np.array([b"x", b"yz"], dtype=object), st))
    assert s.tolist() == [b"x", b"yz"]
    tp = st.tensor_pb2.TensorProto(dtype=1)  # typed float_val, TF's "fill" form
    tp.tensor_shape.dim.add().size = 3
    tp.float_val.append(2.5)
    assert from_tensor_proto(tp).tolist() == [2.5, 2.5, 2.5]


def test_urls_and_options() -> None:
    b = TFServingBackend("tfserving://h1:8501,h2:9001?grpc_port=9000")
    assert [(e.rest, e.grpc) for e in b.endpoints] == [
        ("h1:8501", "h1:9000"),
        ("h2:9001", "h2:9000"),
    ]
    assert b.inventory() == {"cpu": 2} and b.free() == {"cpu": 2}
    g = TFServingBackend("tfserving+grpc://h:8500", hardware="gpu-k80")
    assert g.protocol == "grpc" and g.inventory() == {"gpu-k80": 1}
    assert (
        TFServingBackend("tfserving://h:8501").endpoints[0].grpc == "h:8500"
    )  # TF Serving's pairing
    assert TFServingBackend("tfserving://h:7001").endpoints[0].grpc is None
    for bad in ("tfserving://h", "http://h:1", "tfserving://h:1?colour=red"):
        with pytest.raises(ValidationError):
            TFServingBackend(bad)
    with pytest.raises(ValidationError, match="tensorflow_model_server"):
        TFServingBackend("tfserving://127.0.0.1?launch=1", binary="")  # none on PATH here

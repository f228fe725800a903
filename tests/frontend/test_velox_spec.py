"""The deployment's ``velox`` block: round trip and validation naming the field."""

import json

import pytest

from inferline.core import ValidationError
from inferline.deploy import Deployment
from inferline.server import VeloxSpec

BLOCK = {
    "store": "v.sqlite",
    "models": [
        {"name": "s", "dim": 3, "features": {"model": "embed", "output": "e", "timeout_ms": 50}},
        {
            "name": "t",
            "features": {"table": "items.npz", "unknown": "mean"},
            "config": {"alpha": 0.5},
        },
    ],
}
DEP = {
    "format": "inferline.deployment/1",
    "name": "d",
    "backend": "local://",
    "models": [{"name": "embed", "source": "inferline.adapters.local.examples:scale"}],
    "apps": {},
    "velox": BLOCK,
}


def test_round_trip():
    spec = VeloxSpec.from_dict(json.loads(json.dumps(BLOCK)))
    assert spec.to_dict() == BLOCK and VeloxSpec.from_dict(spec.to_dict()) == spec
    dep = Deployment.from_dict(json.loads(json.dumps(DEP)))
    assert dep.velox == spec and dep.to_dict()["velox"] == BLOCK


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["models"][0].pop("dim"), "velox.models[0].dim"),
        (lambda b: b["models"][0]["features"].update(table="x.npz"), "velox.models[0].features"),
        (lambda b: b["models"][1]["config"].update(nope=1), "velox.models[1].config"),
        (
            lambda b: b["models"][0]["features"].update(timeout_ms=-1),
            "velox.models[0].features.timeout_ms",
        ),
        (lambda b: b.update(models=[]), "velox.models"),
        (lambda b: b.update(extra=1), "velox.extra"),
    ],
)
def test_validation_names_the_field(mutate, field):
    b = json.loads(json.dumps(BLOCK))
    mutate(b)
    with pytest.raises(ValidationError) as e:
        VeloxSpec.from_dict(b)
    assert e.value.field == field

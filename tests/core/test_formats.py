"""Round trips and validation messages of the JSON formats."""

import json

import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    TunerInputs,
    TunerModel,
    ValidationError,
    load_catalog,
    load_pipeline,
    save,
)
from inferline.core.protocols import ModelSpec

PROFILES = {
    "format": "inferline.profiles/1",
    "models": {
        "resnet152": {
            "cpu": {"1": {"latency_s": 1.6}, "2": {"latency_s": 3.1}},
            "gpu-k80": {
                "1": {"latency_s": 0.021, "p99_s": 0.024, "samples": 200},
                "32": {"latency_s": 0.63},
            },
        }
    },
}
PIPELINE = {
    "format": "inferline.pipeline/1",
    "name": "video-monitoring",
    "models": ["yolo", "vehicle", "person", "alpr"],
    "edges": [["yolo", "vehicle"], ["yolo", "person"], ["vehicle", "alpr"]],
    "scale_factors": {"vehicle": 0.6, "person": 0.5, "alpr": 0.3},
}
PLAN = {
    "format": "inferline.plan/1",
    "pipeline": "video-monitoring",
    "slo_s": 0.2,
    "percentile": 99,
    "cost_per_hour": 3.87,
    "estimated_latency_s": 0.183,
    "strategy": "inferline",
    "models": {"yolo": {"hardware": "gpu-k80", "max_batch_size": 8, "replicas": 3}},
    "tuner": {
        "service_time_s": 0.05,
        "envelope": [[0.05, 3], [0.1, 4]],
        "mean_rate_qps": 100.0,
        "models": {
            "yolo": {"scale_factor": 1.0, "throughput_qps": 120.0, "max_provisioning_ratio": 0.4}
        },
    },
}


@pytest.mark.parametrize(
    ("cls", "doc"),
    [
        (Profiles, PROFILES),
        (Pipeline, PIPELINE),
        (Plan, PLAN),
        (HardwareCatalog, DEFAULT_CATALOG.to_dict()),
    ],
)
def test_round_trip_is_exact(cls, doc):
    obj = cls.from_dict(json.loads(json.dumps(doc)))
    assert obj.to_dict() == doc
    assert cls.from_dict(obj.to_dict()) == obj


def test_model_spec_and_tuner_round_trip():
    spec = ModelSpec("m", "pkg.mod:make", {"k": 1}, "2", threads=2)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    t = TunerInputs(0.1, ((0.1, 5), (0.2, 8)), 50.0, {"a": TunerModel(1.0, 10.0, 0.5)})
    assert TunerInputs.from_dict(t.to_dict()) == t


def test_profile_lookup_uses_smallest_profiled_batch_at_least_as_large():
    p = Profiles.from_dict(PROFILES)
    assert p.latency("resnet152", "gpu-k80", 1) == 0.021
    assert p.latency("resnet152", "gpu-k80", 2) == 0.63
    assert p.latency("resnet152", "gpu-k80", 32) == 0.63
    with pytest.raises(ValidationError, match="largest profiled size 32"):
        p.latency("resnet152", "gpu-k80", 33)


def test_pipeline_structure():
    p = Pipeline.from_dict(PIPELINE)
    assert p.roots == ("yolo",)
    assert p.parents["alpr"] == ("vehicle",)
    assert p.visit_probability("alpr") == pytest.approx(0.5)
    assert p.topological_order[0] == "yolo"
    length, path = p.critical_path({"yolo": 1, "vehicle": 2, "person": 5, "alpr": 1})
    assert (length, path) == (6, ("yolo", "person"))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["edges"].append(["alpr", "yolo"]), "edges"),
        (lambda d: d["edges"].append(["yolo", "nope"]), "edges[3]"),
        (lambda d: d["scale_factors"].update(person=1.5), "scale_factors.person"),
        (lambda d: d.update(format="x"), "format"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d.update(models="yolo"), "models"),
    ],
)
def test_pipeline_validation_names_the_field(mutate, field):
    d = json.loads(json.dumps(PIPELINE))
    mutate(d)
    with pytest.raises(ValidationError) as e:
        Pipeline.from_dict(d)
    assert e.value.field == field


def test_plan_validation_names_nested_field():
    d = json.loads(json.dumps(PLAN))
    d["models"]["yolo"]["replicas"] = -1
    with pytest.raises(ValidationError) as e:
        Plan.from_dict(d)
    assert e.value.field == "models.yolo.replicas"
    assert "integer >= 0" in str(e.value)


def test_profiles_validation_names_batch_key():
    d = json.loads(json.dumps(PROFILES))
    d["models"]["resnet152"]["cpu"]["x"] = {"latency_s": 1}
    with pytest.raises(ValidationError) as e:
        Profiles.from_dict(d)
    assert e.value.field == "models.resnet152.cpu.x"


def test_catalog_override_by_file(tmp_path):
    f = tmp_path / "hw.json"
    f.write_text(
        json.dumps(
            {
                "format": "inferline.hardware/1",
                "hardware": {
                    "cpu": {"kind": "cpu", "cost_per_hour": 0.1},
                    "tpu": {"kind": "gpu", "cost_per_hour": 4.0},
                },
            }
        )
    )
    cat = load_catalog(f)
    assert cat.cost("cpu") == 0.1 and cat.cost("gpu-v100") == 2.528 and "tpu" in cat


def test_save_and_load_names_file_in_errors(tmp_path):
    f = tmp_path / "p.json"
    save(Pipeline.from_dict(PIPELINE), f)
    assert load_pipeline(f) == Pipeline.from_dict(PIPELINE)
    f.write_text("{bad")
    with pytest.raises(ValidationError, match="valid JSON"):
        load_pipeline(f)


def test_model_config_cost():
    assert ModelConfig("gpu-k80", 8, 3).cost_per_hour(DEFAULT_CATALOG) == pytest.approx(3 * 0.634)

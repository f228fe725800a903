"""``inferline export``: each writer's files parsed back with the serving system's own schema
(Triton's ``model_config_pb2`` and TF Serving's ``ModelServerConfig`` with protobuf's text
format, ``BatchingParameters`` against its declared fields, Ray Serve's ``ServeDeploySchema``
in its own environment), every planned field checked, the operator's other fields kept, and
the command's errors naming what is wrong."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from inferline.cli import main
from inferline.core import ModelConfig, Plan, TunerInputs, TunerModel, ValidationError, save
from inferline.deploy import EXPORT_TARGETS, export_plan

ROOT = Path(__file__).resolve().parent.parent
# Ray Serve's schema needs ray[serve], whose dependencies the project's environment lacks
RAY_SERVE_PYTHON = ROOT / ".cache" / "ray-serve-venv" / "bin" / "python"
RAY_SERVE_SETUP = (
    "python3.11 -m venv .cache/ray-serve-venv && "
    ".cache/ray-serve-venv/bin/pip install 'ray[serve]==2.60.0'"
)


def _plan(tuner: bool = True, **extra: ModelConfig) -> Plan:
    models = {
        "pre": ModelConfig("cpu", 16, 2, 1.5),
        "cls": ModelConfig("gpu-v100", 32, 3),
        **extra,
    }
    t = TunerInputs(
        0.01,
        ((1.0, 10),),
        100.0,
        {"pre": TunerModel(1.0, 800.0, 0.5), "cls": TunerModel(1.0, 3000.0, 0.5)},
    )
    return Plan("digits", 0.2, models, tuner=t if tuner else None)


# -- Triton ------------------------------------------------------------------------------------

mc = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc]")
text_format = pytest.importorskip("google.protobuf.text_format")

CPU, GPU = mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_GPU

OPERATOR_PRE = """
# the operator's own comment
name: "pre"
backend: "python"
max_batch_size: 64
version_policy { latest { num_versions: 2 } }
input [ { name: "image", data_type: TYPE_FP32, dims: [8, 8] } ]
output [ { name: "features", data_type: TYPE_FP32, dims: [64] } ]
instance_group [
  { count: 1, kind: KIND_CPU, rate_limiter { resources [ { name: "R", count: 2 } ] } },
  { name: "pinned", count: 1, kind: KIND_CPU }
]
dynamic_batching {
  max_queue_delay_microseconds: 100
  preferred_batch_size: [4, 8]
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: REJECT, default_timeout_microseconds: 5000 }
}
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/env.tar.gz" } }
model_warmup [ { name: "w", batch_size: 1,
  inputs { key: "image" value { data_type: TYPE_FP32, dims: [8, 8], zero_data: true } } } ]
"""
OPERATOR_CLS = """
name: "cls"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "features", data_type: TYPE_FP32, dims: [64] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [1] } ]
instance_group [ { count: 1, kind: KIND_GPU, gpus: [0] } ]
"""
ENSEMBLE = """
name: "digits"
platform: "ensemble"
max_batch_size: 64
input [ { name: "image", data_type: TYPE_FP32, dims: [8, 8] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [1] } ]
ensemble_scheduling { step [
  { model_name: "pre", model_version: -1,
    input_map { key: "image" value: "image" } output_map { key: "features" value: "f" } },
  { model_name: "cls", model_version: -1,
    input_map { key: "features" value: "f" } output_map { key: "label" value: "label" } }
] }
"""


def _parse(path: Path) -> Any:
    msg = mc.ModelConfig()
    text_format.Parse(path.read_text(), msg)
    return msg


def _repository(root: Path, **configs: str) -> Path:
    for name, text in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text("# weights and code\n")
        (root / name / "config.pbtxt").write_text(text)
    return root


def _check_planned(c: Any, cfg: ModelConfig, kind: int, first_count: int) -> None:
    assert c.max_batch_size == cfg.max_batch_size
    assert c.instance_group[0].count == first_count and c.instance_group[0].kind == kind
    assert c.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert c.dynamic_batching.max_queue_delay_microseconds == round(cfg.batch_wait_ms * 1000)
    assert list(c.dynamic_batching.preferred_batch_size) == [cfg.max_batch_size]


def test_triton_without_a_repository_writes_the_planned_fields(tmp_path: Path) -> None:
    plan = _plan()
    r = export_plan(plan, "triton", tmp_path / "out", origin="plan.json")
    assert r.written == (tmp_path / "out/pre/config.pbtxt", tmp_path / "out/cls/config.pbtxt")
    for name, kind in (("pre", CPU), ("cls", GPU)):
        path = tmp_path / "out" / name / "config.pbtxt"
        c = _parse(path)
        assert c.name == name and not c.backend and not c.input
        _check_planned(c, plan.models[name], kind, plan.models[name].replicas)
        assert len(c.instance_group) == 1
        text = path.read_text()
        assert text.startswith("# Written by `inferline export --to triton` from plan.json")
        assert "Planned fields only" in text
    assert any("planned fields only" in n for n in r.notes)


def _without_planned(c: Any) -> Any:
    """``c`` with the planned fields cleared: what must equal the operator's config."""
    c = type(c).FromString(c.SerializeToString())
    c.ClearField("max_batch_size")
    c.instance_group[0].ClearField("count")
    c.instance_group[0].ClearField("kind")
    c.instance_group[0].ClearField("gpus")
    c.dynamic_batching.ClearField("max_queue_delay_microseconds")
    c.dynamic_batching.ClearField("preferred_batch_size")
    return c


def test_triton_with_a_repository_keeps_every_other_field(tmp_path: Path) -> None:
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE, cls=OPERATOR_CLS)
    plan = _plan()
    r = export_plan(plan, "triton", tmp_path / "out", repository=src)
    pre = _parse(tmp_path / "out/pre/config.pbtxt")
    # the second group's one instance is the operator's: the first holds the rest
    _check_planned(pre, plan.models["pre"], CPU, plan.models["pre"].replicas - 1)
    assert _without_planned(pre) == _without_planned(_parse(src / "pre/config.pbtxt"))
    assert pre.dynamic_batching.priority_levels == 2  # spot checks of what survived
    assert pre.instance_group[0].rate_limiter.resources[0].name == "R"
    assert pre.instance_group[1].name == "pinned" and pre.instance_group[1].count == 1
    assert pre.parameters["EXECUTION_ENV_PATH"].string_value == "/env.tar.gz"
    assert pre.model_warmup[0].name == "w" and pre.version_policy.latest.num_versions == 2
    cls = _parse(tmp_path / "out/cls/config.pbtxt")
    # a KIND_GPU group pinned to one GPU keeps its GPU: count is per GPU
    _check_planned(cls, plan.models["cls"], GPU, 3)
    assert list(cls.instance_group[0].gpus) == [0] and cls.platform == "onnxruntime_onnx"
    assert "Every other field is as in" in (tmp_path / "out/pre/config.pbtxt").read_text()
    assert not (tmp_path / "out/pre/1").exists()  # configs only without --copy-models
    assert r.notes == ()


def test_triton_copy_models_copies_the_files_but_writes_its_config(tmp_path: Path) -> None:
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE, cls=OPERATOR_CLS)
    export_plan(_plan(), "triton", tmp_path / "out", repository=src, copy_models=True)
    assert (tmp_path / "out/pre/1/model.py").read_text() == "# weights and code\n"
    assert _parse(tmp_path / "out/pre/config.pbtxt").max_batch_size == 16
    assert (src / "pre/config.pbtxt").read_text() == OPERATOR_PRE  # the source is untouched


def test_triton_exports_the_ensemble_with_a_batch_its_steps_take(tmp_path: Path) -> None:
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE, cls=OPERATOR_CLS, digits=ENSEMBLE)
    _repository(tmp_path / "src", other='name: "other"\nbackend: "python"\n')
    r = export_plan(_plan(), "triton", tmp_path / "out", repository=src, copy_models=True)
    ens = _parse(tmp_path / "out/digits/config.pbtxt")
    assert ens.max_batch_size == 16  # the smaller of the steps' planned 16 and 32
    assert ens.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    assert not ens.instance_group and [s.model_name for s in ens.ensemble_scheduling.step] == [
        "pre",
        "cls",
    ]
    assert (tmp_path / "out/digits/1").is_dir()  # Triton needs the ensemble's version folder
    assert not (tmp_path / "out/other").exists()  # not in the plan, no ensemble of it
    assert tmp_path / "out/digits/config.pbtxt" in r.written


def test_triton_gpu_changes_and_refusals_name_the_field(tmp_path: Path) -> None:
    two_gpus = OPERATOR_CLS.replace("gpus: [0]", "gpus: [0, 1]")
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE.replace("KIND_CPU", "KIND_GPU"))
    _repository(src, cls=two_gpus)
    plan = _plan(cls=ModelConfig("gpu-v100", 32, 4), pre=ModelConfig("cpu", 16, 3))
    export_plan(plan, "triton", tmp_path / "out", repository=src)
    cls = _parse(tmp_path / "out/cls/config.pbtxt")
    assert cls.instance_group[0].count == 2 and list(cls.instance_group[0].gpus) == [0, 1]
    pre = _parse(tmp_path / "out/pre/config.pbtxt")
    assert pre.instance_group[0].kind == CPU and not pre.instance_group[0].gpus

    def refused(p: Plan, repo: Path | None = src) -> ValidationError:
        out = tmp_path / "refused"
        with pytest.raises(ValidationError) as e:
            export_plan(p, "triton", out, repository=repo)
        assert not out.exists()  # checked before the first write
        return e.value

    e = refused(_plan(cls=ModelConfig("gpu-v100", 32, 3)))
    assert e.field == "plan.models.cls.replicas" and "multiple of 2" in e.expected
    e = refused(_plan(pre=ModelConfig("cpu", 16, 1)))  # the operator's second group holds 1
    assert e.field == "plan.models.pre.replicas"
    e = refused(_plan(cls=ModelConfig("gpu-v100", 32, 4), extra=ModelConfig("cpu", 1, 1)))
    assert e.field == "plan.models.extra" and e.got == "no such model"
    _repository(tmp_path / "nobatch", pre=OPERATOR_PRE.replace("max_batch_size: 64", ""))
    _repository(tmp_path / "nobatch", cls=OPERATOR_CLS)
    e = refused(_plan(), tmp_path / "nobatch")
    assert e.field == "plan.models.pre.max_batch_size" and "max_batch_size 0" in e.expected
    e = refused(_plan(cls=ModelConfig("tpu-v9", 8, 1)), None)
    assert e.field == "models.cls.hardware"
    (src / "pre/config.pbtxt").write_text("name: 'pre' nonsense {")
    e = refused(_plan())
    assert e.field == str(src / "pre/config.pbtxt") and "text format" in e.expected


def test_triton_keeps_a_sequence_batcher(tmp_path: Path) -> None:
    seq = OPERATOR_CLS + "sequence_batching { max_sequence_idle_microseconds: 5000000 }\n"
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE, cls=seq)
    r = export_plan(_plan(), "triton", tmp_path / "out", repository=src)
    cls = _parse(tmp_path / "out/cls/config.pbtxt")
    assert cls.WhichOneof("scheduling_choice") == "sequence_batching"
    assert cls.max_batch_size == 32 and cls.instance_group[0].count == 3
    assert any("cls: sequence_batching kept" in n for n in r.notes)


def test_an_idle_model_is_left_out_with_a_note(tmp_path: Path) -> None:
    r = export_plan(_plan(idle=ModelConfig("cpu", 4, 0)), "triton", tmp_path / "out")
    assert not (tmp_path / "out/idle").exists()
    assert any(n.startswith("idle: 0 replicas") for n in r.notes)


# -- TF Serving --------------------------------------------------------------------------------

OPERATOR_MODELS = """
model_config_list {
  config {
    name: "pre"
    base_path: "/srv/models/pre"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 3 versions: 4 } }
    version_labels { key: "stable" value: 3 }
  }
  config { name: "other" base_path: "/srv/models/other" model_platform: "tensorflow" }
  config { name: "cls" base_path: "/srv/models/cls" model_platform: "tensorflow" }
}
"""


def _batching_parameters_class() -> Any:
    """TF Serving's ``BatchingParameters`` (session_bundle_config.proto), declared here with
    the fields export writes: ``tensorflow-serving-api`` does not ship its generated module.
    Parsing with it refuses a misspelt field or a bare value where a wrapper belongs."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    f = descriptor_pb2.FileDescriptorProto(
        name="session_bundle_config.proto",
        package="tensorflow.serving",
        dependency=["google/protobuf/wrappers.proto"],
        syntax="proto3",
    )
    m = f.message_type.add(name="BatchingParameters")
    fields = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches")
    for number, name in enumerate((*fields, "num_batch_threads"), 1):
        m.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
            type_name=".google.protobuf.Int64Value",
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    m.field.add(
        name="allowed_batch_sizes",
        number=6,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    )


def _batching(path: Path) -> Any:
    msg = _batching_parameters_class()()
    text_format.Parse(path.read_text(), msg)
    return msg


def _model_server_config(path: Path) -> Any:
    from inferline.adapters.tfserving import grpc_available, grpc_stubs

    if not grpc_available():
        pytest.skip("tensorflow-serving-api (extra 'tfserving') is not installed")
    msg = grpc_stubs().model_server_config_pb2.ModelServerConfig()
    text_format.Parse(path.read_text(), msg)
    return msg


def test_tfserving_round_trip_of_every_planned_field(tmp_path: Path) -> None:
    plan = _plan()
    r = export_plan(plan, "tfserving", tmp_path / "out", base_path="/srv/m/")
    cfg = _model_server_config(tmp_path / "out/models.config")
    entries = {c.name: c for c in cfg.model_config_list.config}
    assert set(entries) == {"pre", "cls"}
    assert entries["pre"].base_path == "/srv/m/pre"
    assert entries["pre"].model_platform == "tensorflow"
    for name, cfg_ in plan.models.items():
        b = _batching(tmp_path / "out" / name / "batching_params.pbtxt")
        assert b.max_batch_size.value == cfg_.max_batch_size
        assert b.batch_timeout_micros.value == round(cfg_.batch_wait_ms * 1000)
        assert b.num_batch_threads.value == cfg_.replicas
        assert not b.allowed_batch_sizes
    # batches finished within the SLO: 0.2 s x 800 q/s / 16 per batch x 2 replicas = 20
    assert _batching(tmp_path / "out/pre/batching_params.pbtxt").max_enqueued_batches.value == 20
    # 0.2 x 3000 / 32 x 3 = 56.25 -> 57
    assert _batching(tmp_path / "out/cls/batching_params.pbtxt").max_enqueued_batches.value == 57
    pool = _batching(tmp_path / "out/batching_parameters.txt")
    assert pool.num_batch_threads.value == 5 and not pool.HasField("max_batch_size")
    assert "--enable_per_model_batching_parameters" in (tmp_path / "out/models.config").read_text()
    assert any("cls: planned on GPUs" in n for n in r.notes)
    assert len(r.written) == 4


def test_tfserving_keeps_the_operators_entries(tmp_path: Path) -> None:
    src = tmp_path / "models.config"
    src.write_text(OPERATOR_MODELS)
    export_plan(_plan(tuner=False), "tfserving", tmp_path / "out", repository=src)
    got = _model_server_config(tmp_path / "out/models.config")
    want = _model_server_config(src)
    assert got == want  # every entry, the unplanned "other" too, field for field
    b = _batching(tmp_path / "out/pre/batching_params.pbtxt")
    assert not b.HasField("max_enqueued_batches")  # no tuner figures: TF Serving's default
    src.write_text(OPERATOR_MODELS.replace('name: "cls"', 'name: "knn"'))
    with pytest.raises(ValidationError) as e:
        export_plan(_plan(), "tfserving", tmp_path / "out2", repository=src)
    assert e.value.field == "plan.models.cls" and not (tmp_path / "out2").exists()


# -- Ray Serve ---------------------------------------------------------------------------------


def _check_serve_doc(doc: dict[str, Any], plan: Plan, import_path: str) -> None:
    (app,) = doc["applications"]
    assert app["name"] == plan.pipeline and app["import_path"] == import_path
    deps = {d["name"]: d for d in app["deployments"]}
    assert set(deps) == set(plan.models)
    for name, cfg in plan.models.items():
        d = deps[name]
        assert d["num_replicas"] == cfg.replicas
        assert d["max_ongoing_requests"] == cfg.max_batch_size
        assert d["user_config"] == {
            "max_batch_size": cfg.max_batch_size,
            "batch_wait_timeout_s": cfg.batch_wait_ms / 1e3,
        }
        assert isinstance(d["user_config"]["batch_wait_timeout_s"], float)
    assert deps["cls"]["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert deps["pre"]["ray_actor_options"] == {"num_cpus": 1}


@pytest.mark.parametrize("name", ["serve.yaml", "serve.json"])
def test_ray_serve_round_trip(tmp_path: Path, name: str) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the YAML back")
    # a wait of 10 us: PyYAML reads an exponent form (1e-05) as a string
    plan = _plan(pre=ModelConfig("cpu", 16, 2, 0.01))
    out = tmp_path / name
    r = export_plan(plan, "ray-serve", out, import_path="digits.app:app")
    doc = yaml.safe_load(out.read_text()) if name.endswith("yaml") else json.loads(out.read_text())
    _check_serve_doc(doc, plan, "digits.app:app")
    assert r.written == (out,) and any("reconfigure()" in n for n in r.notes)
    if name.endswith("yaml"):
        assert out.read_text().startswith("# Written by `inferline export --to ray-serve`")


def test_ray_serve_refuses_a_bad_import_path_and_suffix(tmp_path: Path) -> None:
    for bad in ("app", "a:b:c", ":app", "app:"):
        with pytest.raises(ValidationError) as e:
            export_plan(_plan(), "ray-serve", tmp_path / "s.yaml", import_path=bad)
        assert e.value.field == "--import-path"
    with pytest.raises(ValidationError) as e:
        export_plan(_plan(), "ray-serve", tmp_path / "s.toml")
    assert e.value.field == "--to ray-serve FILE"


_VALIDATE = """
import json, sys, yaml
from ray.serve.schema import ServeDeploySchema
for path in sys.argv[1:]:
    doc = yaml.safe_load(open(path))  # JSON is YAML too: what `serve deploy` reads
    s = ServeDeploySchema.model_validate(doc)
    print(json.dumps(s.model_dump(mode="json", exclude_unset=True)))
"""


@pytest.mark.skipif(
    not RAY_SERVE_PYTHON.exists(),
    reason=f"Ray Serve's own environment {RAY_SERVE_PYTHON} is absent (make it: {RAY_SERVE_SETUP})",
)
def test_ray_serve_schema_accepts_the_config(tmp_path: Path) -> None:
    plan = _plan()
    paths = [tmp_path / "serve.yaml", tmp_path / "serve.json"]
    for p in paths:
        export_plan(plan, "ray-serve", p, import_path="digits.app:app")
    p = subprocess.run(
        [str(RAY_SERVE_PYTHON), "-c", _VALIDATE, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    docs = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(docs) == 2 and docs[0] == docs[1]
    _check_serve_doc(docs[0], plan, "digits.app:app")  # as Ray Serve read it


# -- the command -------------------------------------------------------------------------------


def test_cli_exports_each_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(_plan(), tmp_path / "plan.json")
    plan = str(tmp_path / "plan.json")
    assert set(EXPORT_TARGETS) == {"triton", "tfserving", "ray-serve"}
    assert main(["export", plan, "--to", "triton", str(tmp_path / "t")]) == 0
    assert f"wrote {tmp_path / 't/pre/config.pbtxt'}" in capsys.readouterr().out
    assert main(["export", plan, "--to", "tfserving", str(tmp_path / "tf")]) == 0
    assert (tmp_path / "tf/cls/batching_params.pbtxt").is_file()
    out = tmp_path / "serve.yaml"
    assert main(["export", plan, "--to", "ray-serve", str(out), "--import-path", "m:app"]) == 0
    assert '"m:app"' in out.read_text()


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_cli_errors_name_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(_plan(), tmp_path / "plan.json")
    plan = str(tmp_path / "plan.json")
    line = _refused(["export", plan, "--to", "k8s", str(tmp_path / "o")], capsys)
    assert "argument --to: expected one of triton, tfserving, ray-serve, got 'k8s'" in line
    line = _refused(["export", plan, "--to", "ray-serve", str(tmp_path / "s.toml")], capsys)
    assert "argument --to ray-serve" in line and ".yaml" in line
    line = _refused(
        ["export", plan, "--to", "triton", str(tmp_path / "o"), "--copy-models"], capsys
    )
    assert "argument --copy-models: needs --to triton and --repository" in line
    line = _refused(
        ["export", plan, "--to", "triton", str(tmp_path / "o"), "--import-path", "a:b"], capsys
    )
    assert "argument --import-path" in line
    # missing plan: the file is named, exit status 2, no traceback
    assert main(["export", str(tmp_path / "nope.json"), "--to", "triton", "o"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.json'}: expected an existing file" in err
    assert "Traceback" not in err
    # a model of the plan missing from the repository
    src = _repository(tmp_path / "src", pre=OPERATOR_PRE)
    argv = ["export", plan, "--to", "triton", str(tmp_path / "o"), "--repository", str(src)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "plan.models.cls: expected a model of the repository" in err
    assert not (tmp_path / "o").exists()


def test_a_plan_made_for_the_servers_batchers_exports_their_settings(tmp_path: Path) -> None:
    """``inferline plan --server triton|tfserving`` plans the servers' own knobs: the export
    writes those (preferred sizes, queue delay, queue timeout; batch timeout, threads, queue
    bound, allowed sizes), not the batch wait of inferline's queue."""
    from dataclasses import replace

    from inferline.core import TFServingBatcher, TritonBatcher

    tri = TritonBatcher(16, (4, 8), 2500, 180_000).to_dict()
    tfs = TFServingBatcher(32, 1500, 3, 7, (8, 16, 32)).to_dict()
    plan = replace(_plan(), server_batchers={"pre": tri, "cls": tfs})
    plan = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))  # as read from a plan file
    export_plan(plan, "triton", tmp_path / "t")
    c = _parse(tmp_path / "t/pre/config.pbtxt")
    db = c.dynamic_batching
    assert list(db.preferred_batch_size) == [4, 8]
    assert db.max_queue_delay_microseconds == 2500
    q = db.default_queue_policy
    assert q.timeout_action == q.REJECT and q.default_timeout_microseconds == 180_000
    assert q.allow_timeout_override
    export_plan(plan, "tfserving", tmp_path / "f")
    b = _batching(tmp_path / "f/cls/batching_params.pbtxt")
    assert (b.max_batch_size.value, b.batch_timeout_micros.value) == (32, 1500)
    assert (b.num_batch_threads.value, b.max_enqueued_batches.value) == (3, 7)
    assert list(b.allowed_batch_sizes) == [8, 16, 32]

"""Attach keeps the operator's TF Serving model config (issue 35, items 1 and 3).

Two servers (the real ``tensorflow_model_server`` when present, else the STAND-IN, which
implements the real version-policy and label semantics) start from an operator's config with
``all``, ``latest {num_versions: 2}`` and ``specific`` policies, version labels and a logging
config. inferline's backend (what ``inferline attach`` drives) deploys, scales, adopts and
recovers its models; after each step every operator entry the servers hold is, protobuf
message for message, the one the operator wrote, the served versions follow the policies and
label requests resolve. ``restore_operator_settings()`` and ``restore_snapshot()`` (the path
of ``inferline detach`` after a crash) put back the whole config exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from tfserving_standin import Digits, TFServer, export_model, server_kind

from inferline.adapters.tfserving import (
    ServedModel,
    TFServingBackend,
    format_text,
    grpc_available,
    restore_snapshot,
)
from inferline.core import ModelConfig, ModelSpec, ReplicaError

KIND = server_kind()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not grpc_available(), reason="model management needs tensorflow-serving-api"
    ),
    pytest.mark.skipif(
        KIND == "real", reason="reads the loaded config back through the STAND-IN-only route"
    ),
]

# what each operator model serves (its policy) and what its labels name
SERVED = {"op_all": [1, 2, 3], "op_latest": [2, 3], "op_specific": [1, 3]}
LABELS = {
    "op_all": {"old": 1},
    "op_latest": {"stable": 2, "canary": 3},
    "op_specific": {"stable": 1},
}

OPERATOR_CONFIG = """\
# the operator's own file: comments, both quote styles, a list form and a logging config
model_config_list {{
  config {{
    name: "op_all"
    base_path: "{root}/op_all"
    model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "old" value: 1 }}
  }}
  config {{
    name: 'op_latest'
    base_path: "{root}/op_latest"
    model_platform: "tensorflow"
    model_version_policy: {{ latest {{ num_versions: 2 }} }}
    version_labels {{ key: "stable" value: 2 }}
    version_labels {{ key: "canary" value: 3 }}
    logging_config {{
      log_collector_config {{ type: "file" filename_prefix: "/tmp/op_latest" }}
      sampling_config {{ sampling_rate: 0.25 }}
    }}
  }}
  config {{
    name: "op_specific"
    base_path: "{root}/op_specific"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: [1, 3] }} }}
    version_labels {{ key: "stable" value: 1 }}
  }}
}}
"""


def _proto(text: str) -> Any:
    from google.protobuf import text_format

    from inferline.adapters.tfserving._protos import stubs

    cfg = stubs().model_server_config_pb2.ModelServerConfig()
    text_format.Parse(text, cfg)
    return cfg


def _loaded(server: TFServer) -> Any:
    """The config the server holds now (STAND-IN-only route), as a protobuf message."""
    r = requests.get(f"http://{server.rest}/standin/model_config", timeout=10)
    r.raise_for_status()
    return _proto(r.json()["model_config"])


def _entries(cfg: Any) -> dict[str, Any]:
    return {c.name: c for c in cfg.model_config_list.config}


def _check_operator_models(servers: list[TFServer], original: Any, x: np.ndarray) -> None:
    """Every operator entry round-trips exactly; versions follow the policies; labels resolve."""
    want = _entries(original)
    for s in servers:
        got = _entries(_loaded(s))
        for name in SERVED:
            assert got[name] == want[name], (s.rest, name, got.get(name))
        base = f"http://{s.rest}/v1/models"
        for name, versions in SERVED.items():
            assert _available(f"{base}/{name}") == versions
            for label, v in LABELS[name].items():
                st = requests.get(f"{base}/{name}/labels/{label}", timeout=10).json()
                assert [int(r["version"]) for r in st["model_version_status"]] == [v]
                r = requests.post(
                    f"{base}/{name}/labels/{label}:predict",
                    json={"instances": x[:2].tolist()},
                    timeout=10,
                )
                assert r.status_code == 200, r.text
        r = requests.get(f"{base}/op_all/labels/nope", timeout=10)
        assert r.status_code == 400 and "Unrecognized servable version label" in r.text


def _available(url: str, timeout_s: float = 15.0) -> list[int]:
    """The versions the status lists, once none is LOADING any more (the servers load the
    versions other than the latest after a reload returns, as TF Serving does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = requests.get(url, timeout=10).json()["model_version_status"]
        if all(r["state"] == "AVAILABLE" for r in st) or time.monotonic() > deadline:
            assert all(r["state"] == "AVAILABLE" for r in st), st
            return sorted(int(r["version"]) for r in st)
        time.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Digits, Path, str]:
    root = tmp_path_factory.mktemp("opcfg")
    digits = Digits(root / "models")
    layers = [(digits.lr.coef_.T, digits.lr.intercept_)]
    for name in SERVED:
        for v in (1, 2, 3):
            export_model(root / "models" / name, v, layers)
    return digits, root, OPERATOR_CONFIG.format(root=root / "models")


def _servers(root: Path, text: str) -> list[TFServer]:
    # the real server refuses labels at startup without this flag (they name versions that
    # are still loading); the stand-in accepts it too
    flags = ["--allow_version_labels_for_unavailable_models=true"]
    return [TFServer(root / f"s{i}", config_text=text, flags=flags).start() for i in range(2)]


def _servers_labelled_at_runtime(root: Path, text: str) -> tuple[list[TFServer], Path]:
    """Servers started without the labels flag (so with no labels), labelled by the
    operator's reload once their versions are AVAILABLE; and the file of that config."""
    from inferline.adapters.tfserving import TFServingClient, parse_text
    from inferline.adapters.tfserving._config import without_labels

    models = parse_text(text)
    plain = format_text([without_labels(m) for m in models])
    servers = [TFServer(root / f"s{i}", config_text=plain).start() for i in range(2)]

    async def label() -> None:
        for s in servers:
            for name, versions in SERVED.items():
                assert _available(f"http://{s.rest}/v1/models/{name}") == versions
            c = TFServingClient(None, s.grpc, "grpc", timeout_s=10)
            await c.reload(models)
            await c.close()

    asyncio.run(label())
    path = root / "operator.conf"
    path.write_text(text)
    return servers, path


def _backend(servers: list[TFServer], config_file: Path | None = None) -> TFServingBackend:
    return TFServingBackend(
        "tfserving://" + ",".join(s.rest for s in servers),
        servers=[{"rest": s.rest, "grpc": s.grpc} for s in servers],
        model_config_file=str(config_file or servers[0].config_file),
        load_timeout_s=30,
        recovery_timeout_s=60,
    )


def test_deploy_scale_adopt_recover_keep_the_operator_config(
    setup: tuple[Digits, Path, str], tmp_path: Path
) -> None:
    digits, _, text = setup
    original = _proto(text)
    servers = _servers(tmp_path, text)

    async def main() -> None:
        b = _backend(servers)
        try:
            snap = b.operator_snapshot()
            assert json.loads(json.dumps(snap)) == snap
            _check_operator_models(servers, original, digits.x)
            params = {"base_path": str(digits.paths["digits_lr"]), "outputs": ["classes"]}
            await b.deploy(ModelSpec("lr", "digits_lr", params), ModelConfig("cpu", 8, 1))
            _check_operator_models(servers, original, digits.x)
            await b.scale("lr", 2)
            _check_operator_models(servers, original, digits.x)
            got = await b.replicas("lr")[1].predict_batch(list(digits.x[:10]))
            assert [int(c) for c in got] == list(digits.lr.predict(digits.x[:10]))
            await b.scale("lr", 1)
            _check_operator_models(servers, original, digits.x)
            await b.scale("lr", 2)

            # adopt an operator model and scale it down: its entry leaves one server only
            await b.adopt("op_specific", outputs=["classes"])
            _, h_drop = b.replicas("op_specific")
            await b.scale("op_specific", 1)
            gone = h_drop.endpoint.rest  # type: ignore[attr-defined]
            for s in servers:
                got_cfg = _entries(_loaded(s))
                assert ("op_specific" in got_cfg) == (s.rest != gone)
                assert got_cfg["op_all"] == _entries(original)["op_all"]
            await b.scale("op_specific", 2)  # back with the operator's own entry
            _check_operator_models(servers, original, digits.x)

            # recovery: the operator restarts a killed server from its own file; inferline
            # reloads its model there, carrying the operator's entries unchanged
            victim = servers[1]
            victim.kill()
            h = next(h for h in b.replicas("lr") if h.endpoint.rest == victim.rest)  # type: ignore[attr-defined]
            with pytest.raises(ReplicaError):
                await h.predict_batch(list(digits.x[:3]))
            victim.start()
            for _ in range(600):
                if len(b.replicas("lr")) == 2:
                    break
                await asyncio.sleep(0.05)
            assert len(b.replicas("lr")) == 2
            assert "digits_lr" in _entries(_loaded(victim))
            _check_operator_models(servers, original, digits.x)

            # attach stops: the config before attach is the config after restore
            await b.restore_operator_settings()
            for s in servers:
                assert _loaded(s) == original
            _check_operator_models(servers, original, digits.x)
        finally:
            await b.close()

    try:
        asyncio.run(main())
    finally:
        for s in servers:
            s.stop()


def test_restore_snapshot_after_a_crash(setup: tuple[Digits, Path, str], tmp_path: Path) -> None:
    """``inferline detach URL --snapshot PATH`` after attach died: only the URL and the saved
    snapshot (``restore_snapshot``). The
    servers refuse labels on versions still loading, so the labelled model that comes back
    is loaded first and labelled after (``reload_staged``)."""
    digits, _, text = setup
    original = _proto(text)
    servers, config_file = _servers_labelled_at_runtime(tmp_path, text)

    async def main() -> tuple[str, dict[str, Any]]:
        b = _backend(servers, config_file)
        snap = json.loads(json.dumps(b.operator_snapshot()))
        spec = ModelSpec("lr", "digits_lr", {"base_path": str(digits.paths["digits_lr"])})
        await b.deploy(spec, ModelConfig("cpu", 8, 2))
        await b.adopt("op_latest")
        await b.scale("op_latest", 1)
        await b.close()  # leaves everything as it is, like a crash would
        changed = [_loaded(s) for s in servers]
        assert all("digits_lr" in _entries(c) for c in changed)
        assert any("op_latest" not in _entries(c) for c in changed)
        return b.url, snap

    try:
        url, snap = asyncio.run(main())
        # what a user runs: `inferline detach URL --snapshot PATH`
        path = tmp_path / "snapshot.json"
        path.write_text(json.dumps(snap))
        out = subprocess.run(
            [sys.executable, "-m", "inferline", "detach", url, "--snapshot", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "model set restored (3 models)" in out.stdout
        for s in servers:
            assert _loaded(s) == original
        _check_operator_models(servers, original, digits.x)
        # the library call does the same, and a second restore changes nothing
        done = asyncio.run(restore_snapshot(url, snap))
        assert sorted(done) == sorted(s.grpc for s in servers)
        assert all(_loaded(s) == original for s in servers)
    finally:
        for s in servers:
            s.stop()


def test_label_rules_match_the_real_server(setup: tuple[Digits, Path, str], tmp_path: Path) -> None:
    """The stand-in's label rules (tensorflow_serving/model_servers/server_core.cc): a label
    on a version that is not AVAILABLE fails the reload with FAILED_PRECONDITION (the old
    labels stay), also for a version the same reload loads, which ``reload_staged`` handles;
    gRPC ``version_label`` resolves; an unknown label is INVALID_ARGUMENT."""
    from inferline.adapters.tfserving import TFServingClient, TFServingFailure, parse_text
    from inferline.adapters.tfserving._config import without_labels
    from inferline.adapters.tfserving._snapshot import reload_staged

    digits, _, text = setup
    models = parse_text(text)
    plain = format_text([without_labels(m) for m in models])
    server = TFServer(tmp_path / "s", config_text=plain).start()  # no labels: it starts

    async def main() -> None:
        c = TFServingClient(None, server.grpc, "grpc", timeout_s=10)
        try:
            for name, versions in SERVED.items():
                assert _available(f"http://{server.rest}/v1/models/{name}") == versions
            await c.reload(models)  # every labelled version is AVAILABLE now
            spec = next(m for m in models if m.name == "op_specific")
            bad = dataclasses.replace(spec, labels=(("stable", 2),), text=None)
            with pytest.raises(TFServingFailure) as e:
                await c.reload([bad if m is spec else m for m in models])
            assert e.value.code == "FAILED_PRECONDITION" and "version 2" in e.value.message
            st = requests.get(
                f"http://{server.rest}/v1/models/op_specific/labels/stable", timeout=10
            ).json()
            assert [int(r["version"]) for r in st["model_version_status"]] == [1]

            # a new model labelled on a version other than its latest: refused in one
            # reload, accepted in two steps
            new = ServedModel("op_new", spec.base_path, all_versions=True, labels=(("old", 1),))
            with pytest.raises(TFServingFailure) as e:
                await c.reload([*models, new])
            assert e.value.code == "FAILED_PRECONDITION"
            await c.reload(models)
            await reload_staged(c, [*models, new], ["op_new"], 15.0)
            out = await c.predict("op_new", {"x": digits.x[:3]}, label="old")
            assert list(out["classes"]) == list(digits.lr.predict(digits.x[:3]))

            out = await c.predict("op_latest", {"x": digits.x[:3]}, label="canary")
            assert list(out["classes"]) == list(digits.lr.predict(digits.x[:3]))
            with pytest.raises(TFServingFailure) as e:
                await c.predict("op_latest", {"x": digits.x[:3]}, label="nope")
            assert e.value.code == "INVALID_ARGUMENT"
        finally:
            await c.close()

    try:
        asyncio.run(main())
    finally:
        server.stop()

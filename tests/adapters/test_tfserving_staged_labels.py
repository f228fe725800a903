"""Version labels on a model a reload adds are staged: TF Serving refuses a label on a version
that is not AVAILABLE (FAILED_PRECONDITION), so the model is loaded first without its labels
and labelled by a second reload once the labelled versions are AVAILABLE; a snapshot restore
does the same. Against a fake server that reads each reload as the real client sends it (the
``ModelServerConfig`` message) and applies TF Serving's rule; the real-server round trip is
``integration/test_tfserving_operator_config.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from inferline.adapters.tfserving import grpc_available
from inferline.adapters.tfserving._client import TFServingFailure, TFServingNotFound
from inferline.adapters.tfserving._config import ServedModel, from_proto, parse_text, to_proto

pytestmark = pytest.mark.skipif(not grpc_available(), reason="tensorflow-serving-api not installed")

OPERATOR = """
model_config_list {
  config {
    name: "kept"
    base_path: "/models/kept"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 } }
    version_labels { key: "prod" value: 1 }
  }
  config {
    name: "labelled"
    base_path: "/models/labelled"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
    logging_config { sampling_config { sampling_rate: 0.5 } }
  }
}
"""


class FakeTFServing:
    """TF Serving's model service as far as staging needs it: a reload replaces the model set
    and refuses (FAILED_PRECONDITION) a label on a version not AVAILABLE when it is made;
    the versions it loads answer LOADING to the first status request, then AVAILABLE."""

    def __init__(self, available: dict[str, set[int]]) -> None:
        self.available = {k: set(v) for k, v in available.items()}
        self.loading: dict[str, set[int]] = {}
        self.reloads: list[list[ServedModel]] = []  # what each reload carried, as sent
        self.refused: list[str] = []

    async def reload(self, models: Sequence[ServedModel], timeout_s: float | None = None) -> None:
        from inferline.adapters.tfserving._protos import stubs

        sent = from_proto(to_proto(models, stubs()))  # the message the real client sends
        self.reloads.append(sent)
        for m in sent:
            for label, v in m.labels:
                if v not in self.available.get(m.name, set()):
                    self.refused.append(f"{m.name}:{label}")
                    raise TFServingFailure(
                        "FAILED_PRECONDITION",
                        f"request to assign label to version {v} of model {m.name}, "
                        "which is not currently available for inference",
                    )
        names = {m.name for m in sent}
        self.available = {k: v for k, v in self.available.items() if k in names}
        self.loading = {k: v for k, v in self.loading.items() if k in names}
        for m in sent:
            want = set(m.versions or (1,))
            new = want - self.available.get(m.name, set())
            if new:
                self.loading[m.name] = self.loading.get(m.name, set()) | new

    async def status(self, name: str, *a: Any, **kw: Any) -> list[dict[str, Any]]:
        avail = self.available.get(name, set())
        loading = self.loading.pop(name, set())
        if not avail and not loading:
            raise TFServingNotFound("NOT_FOUND", f"model {name}")
        self.available[name] = avail | loading  # LOADING now, AVAILABLE at the next request
        return [{"version": v, "state": "AVAILABLE"} for v in sorted(avail)] + [
            {"version": v, "state": "LOADING"} for v in sorted(loading)
        ]

    async def close(self) -> None:
        pass


def _labels(models: Sequence[ServedModel]) -> dict[str, dict[str, int]]:
    return {m.name: dict(m.labels) for m in models}


def test_a_reload_adding_a_labelled_model_stages_its_labels() -> None:
    """Fails if the labels are sent in the first step (``put=list(labelled)`` instead of
    ``without_labels``): the server refuses the reload with FAILED_PRECONDITION. The first
    reload carries the added model without labels and everything else as it is (the kept
    model's own labels included: its version is AVAILABLE); the second, the whole set."""
    from inferline.adapters.tfserving._snapshot import reload_staged

    models = parse_text(OPERATOR)
    server = FakeTFServing({"kept": {1}})
    asyncio.run(reload_staged(server, models, ["labelled"], timeout_s=5.0))  # type: ignore[arg-type]
    assert server.refused == []
    first, second = server.reloads
    assert _labels(first) == {"kept": {"prod": 1}, "labelled": {}}
    assert [m.name for m in first] == ["kept", "labelled"]
    assert [m.versions for m in first] == [(1,), (1, 2)]
    assert "sampling_rate: 0.5" in (first[1].text or "")  # every other field stays
    assert _labels(second) == {"kept": {"prod": 1}, "labelled": {"stable": 1, "canary": 2}}
    assert second == models
    assert server.available == {"kept": {1}, "labelled": {1, 2}}


def test_restore_stages_the_labels_of_models_the_server_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``restore_snapshot`` on a server that lost the labelled model (and serves one
    inferline added): the model set comes back in two reloads, the labels in the second, and
    inferline's model is gone. Fails if the staging is broken (labels in the first reload:
    FAILED_PRECONDITION, the restore raises) or skipped (one reload)."""
    from inferline.adapters.tfserving import _snapshot

    server = FakeTFServing({"kept": {1}, "inferline_added": {1}})
    made: list[tuple[Any, ...]] = []

    def client(*a: Any, **kw: Any) -> FakeTFServing:
        made.append(a)
        return server

    monkeypatch.setattr(_snapshot, "TFServingClient", client)
    snap = _snapshot.make_snapshot(
        "tfserving+grpc://h:8500", [("h:8501", "h:8500", parse_text(OPERATOR))]
    )
    done = asyncio.run(_snapshot.restore_snapshot("tfserving+grpc://h:8500", snap, timeout_s=5.0))
    assert done == {"h:8500": "model set restored (2 models)"}
    assert made == [(None, "h:8500", "grpc")]
    assert server.refused == []
    assert [_labels(r) for r in server.reloads] == [
        {"kept": {"prod": 1}, "labelled": {}},
        {"kept": {"prod": 1}, "labelled": {"stable": 1, "canary": 2}},
    ]
    assert server.available == {"kept": {1}, "labelled": {1, 2}}

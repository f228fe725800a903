"""Property test: the model-config reload keeps every entry inferline does not manage exactly.

Hypothesis generates ``ModelServerConfig`` lists as an operator might write them (any names
and base paths, platforms, each kind of version policy, version labels, logging configs),
written in protobuf text format with its options. inferline's own entries are merged in
(replacing some names, appending others, dropping some); through ``parse_text``,
``format_text``, ``to_proto`` and ``from_proto`` every other entry must come out as the same
protobuf message, in the same order.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.adapters.tfserving import (
    ServedModel,
    format_text,
    from_proto,
    grpc_available,
    merged,
    parse_text,
    to_proto,
)

pytestmark = pytest.mark.skipif(
    not grpc_available(), reason="the ModelServerConfig messages need tensorflow-serving-api"
)

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_VERSION = st.integers(0, 2**62)


def _stubs() -> Any:
    from inferline.adapters.tfserving._protos import stubs

    return stubs()


@st.composite
def model_configs(draw: st.DrawFn, name: str) -> Any:
    c = _stubs().model_server_config_pb2.ModelConfig()
    c.name = name
    c.base_path = draw(_TEXT)
    platform = draw(st.sampled_from(["tensorflow", "", "tensorflow", "other"]))
    if platform:
        c.model_platform = platform
    else:
        c.model_type = 1  # the deprecated field, set instead of model_platform
    kind = draw(st.sampled_from(["none", "latest", "latest0", "all", "specific"]))
    pol = c.model_version_policy
    if kind == "latest":
        pol.latest.num_versions = draw(st.integers(1, 10))
    elif kind == "latest0":
        pol.latest.SetInParent()
    elif kind == "all":
        pol.all.SetInParent()
    elif kind == "specific":
        pol.specific.versions.extend(draw(st.lists(_VERSION, max_size=4)))
    for label, v in draw(st.dictionaries(_TEXT, _VERSION, max_size=3)).items():
        c.version_labels[label] = v
    if draw(st.booleans()):
        lc = c.logging_config
        lc.sampling_config.sampling_rate = draw(st.floats(0, 1))
        if draw(st.booleans()):
            lc.log_collector_config.type = draw(_TEXT)
            lc.log_collector_config.filename_prefix = draw(_TEXT)
    return c


@st.composite
def operator_configs(draw: st.DrawFn) -> Any:
    names = draw(st.lists(_TEXT, min_size=0, max_size=5, unique=True))
    cfg = _stubs().model_server_config_pb2.ModelServerConfig()
    for n in names:
        cfg.model_config_list.config.add().CopyFrom(draw(model_configs(n)))
    return cfg


@st.composite
def managed_entries(draw: st.DrawFn, names: list[str]) -> list[ServedModel]:
    """inferline's own entries: some take an operator name, some are new."""
    out = []
    for name in draw(st.lists(st.sampled_from(names), unique=True)) if names else []:
        out.append(ServedModel(name, draw(_TEXT)))
    for i in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["none", "latest", "all", "specific"]))
        out.append(
            ServedModel(
                f"inferline-{i}",
                draw(_TEXT),
                versions=tuple(draw(st.lists(_VERSION, max_size=3)))
                if kind == "specific"
                else None,
                latest=draw(st.integers(1, 5)) if kind == "latest" else None,
                all_versions=kind == "all",
                labels=tuple(sorted(draw(st.dictionaries(_TEXT, _VERSION, max_size=2)).items())),
            )
        )
    return out


def _text_of(cfg: Any, one_line: bool, utf8: bool) -> str:
    from google.protobuf import text_format

    return "# the operator's file\n" + text_format.MessageToString(
        cfg, as_one_line=one_line, as_utf8=utf8
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=operator_configs(), one_line=st.booleans(), utf8=st.booleans(), data=st.data())
def test_reload_keeps_every_entry_it_does_not_manage(
    cfg: Any, one_line: bool, utf8: bool, data: st.DataObject
) -> None:
    s = _stubs()
    text = _text_of(cfg, one_line, utf8)
    operator = parse_text(text)
    assert to_proto(operator, s) == cfg  # read and sent back untouched
    assert to_proto(from_proto(cfg), s) == cfg
    assert to_proto(parse_text(format_text(operator)), s) == cfg

    names = [m.name for m in operator]
    put = data.draw(managed_entries(names))
    drop = data.draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    drop = [n for n in drop if n not in {m.name for m in put}]
    current = {m.name: m for m in operator}
    sent = merged(current, put, drop)
    ours = {m.name for m in put} | set(drop)
    # what reaches the server, by each path the adapter has: the message, the config file
    for models in (list(sent.values()), parse_text(format_text(list(sent.values())))):
        got = to_proto(models, s)
        for path in (got, to_proto(from_proto(got), s)):
            entries = list(path.model_config_list.config)
            kept = [c for c in entries if c.name not in ours]
            want = [c for c in cfg.model_config_list.config if c.name not in ours]
            assert kept == want  # every field, and the operator's order
            assert [c.name for c in entries] == [n for n in sent]
            for m in put:  # inferline's own entries carry exactly their fields
                (back,) = from_proto(_single(path, m.name))
                assert back == m


def _single(cfg: Any, name: str) -> Any:
    out = _stubs().model_server_config_pb2.ModelServerConfig()
    for c in cfg.model_config_list.config:
        if c.name == name:
            out.model_config_list.config.add().CopyFrom(c)
    return out


@given(cfg=operator_configs())
@settings(max_examples=100, deadline=None)
def test_entries_round_trip_json(cfg: Any) -> None:
    """The snapshot's JSON form keeps each entry's text (``inferline detach`` after a crash)."""
    for m in from_proto(cfg):
        back = ServedModel.from_dict(m.to_dict())
        assert back == m and back.text == m.text

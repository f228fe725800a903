"""``build_config`` keeps the operator's instance groups: scaling changes the count of the
first group only; names, rate limiter, host policy, ``KIND_MODEL``, a ``KIND_GPU`` group's GPUs
and every other group and field stay exactly (issue 35, item 2). No server: the real-Triton
round trip is ``integration/test_detach_triton.py``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inferline.adapters.triton import KEEP_BATCHER, BatcherSettings, build_config, instance_count
from inferline.core import ValidationError

RATE = {"resources": [{"name": "R1", "global": False, "count": 2}], "priority": 3}


def _config(*groups: dict[str, Any], max_batch: int = 16) -> dict[str, Any]:
    return {
        "name": "m",
        "backend": "python",
        "max_batch_size": max_batch,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": list(groups),
        "dynamic_batching": {
            "max_queue_delay_microseconds": 500,
            "preferred_batch_size": [4],
            "preserve_ordering": True,
            "priority_levels": 2,
        },
        "model_warmup": [],
        "parameters": {"k": {"string_value": "v"}},
    }


def _diff(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def _group(**kw: Any) -> dict[str, Any]:
    g = {
        "name": "grp_a",
        "kind": "KIND_CPU",
        "count": 1,
        "gpus": [],
        "secondary_devices": [],
        "profile": ["p1"],
        "passive": False,
        "host_policy": "numa0",
        "rate_limiter": copy.deepcopy(RATE),
    }
    g.update(kw)
    return g


def test_scaling_changes_only_the_count_of_a_named_rate_limited_group() -> None:
    cfg = _config(_group())
    before = copy.deepcopy(cfg)
    out = build_config(cfg, max_batch_size=16, replicas=3, batcher=KEEP_BATCHER)
    assert cfg == before  # not changed in place
    assert out["instance_group"] == [_group(count=3)]
    assert _diff(out, cfg) == {"instance_group"}  # the operator's batcher stays, all of it


def test_kind_model_stays_kind_model() -> None:
    cfg = _config(_group(kind="KIND_MODEL", rate_limiter={}))
    out = build_config(cfg, max_batch_size=16, replicas=2, batcher=KEEP_BATCHER)
    (g,) = out["instance_group"]
    assert g["kind"] == "KIND_MODEL" and g["count"] == 2 and g["name"] == "grp_a"
    assert instance_count(out) == 2


def test_kind_gpu_keeps_its_gpus_and_count_is_per_gpu() -> None:
    cfg = _config(_group(kind="KIND_GPU", gpus=[0, 1], count=1))
    assert instance_count(cfg) == 2
    out = build_config(cfg, max_batch_size=16, replicas=6, batcher=KEEP_BATCHER)
    assert out["instance_group"] == [_group(kind="KIND_GPU", gpus=[0, 1], count=3)]
    assert instance_count(out) == 6  # replicas = count x len(gpus)
    with pytest.raises(ValidationError, match=r"replicas.*multiple of 2"):
        build_config(cfg, max_batch_size=16, replicas=5, batcher=KEEP_BATCHER)
    one = _config(_group(kind="KIND_GPU", gpus=[1], count=1))
    assert build_config(one, max_batch_size=16, replicas=3)["instance_group"][0]["gpus"] == [1]


def test_other_groups_stay_exactly_and_count_toward_replicas() -> None:
    second = _group(name="grp_b", count=2, host_policy="numa1", rate_limiter={})
    cfg = _config(_group(), second)
    out = build_config(cfg, max_batch_size=16, replicas=5, batcher=KEEP_BATCHER)
    assert out["instance_group"] == [_group(count=3), second]
    assert instance_count(out) == 5
    with pytest.raises(ValidationError, match=r"m\.replicas"):
        build_config(cfg, max_batch_size=16, replicas=2, batcher=KEEP_BATCHER)


def test_only_the_batching_fields_inferline_owns_change() -> None:
    cfg = _config(_group())
    bigger = build_config(cfg, max_batch_size=32, replicas=1, batcher=KEEP_BATCHER)
    assert _diff(bigger, cfg) == {"max_batch_size"}  # count 1 as before: groups equal
    off = build_config(cfg, max_batch_size=16, replicas=2, batcher=None)
    assert (
        _diff(off, cfg) == {"instance_group", "dynamic_batching"} and "dynamic_batching" not in off
    )
    on = build_config(cfg, max_batch_size=16, replicas=1, batcher=BatcherSettings(100, (8,)))
    assert on["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "preferred_batch_size": [8],
    }


def test_a_hardware_change_is_made_only_when_asked() -> None:
    cfg = _config(_group())
    gpu = build_config(cfg, max_batch_size=16, replicas=3, gpus=[0, 1], batcher=KEEP_BATCHER)
    assert [(g["kind"], g["gpus"], g["count"]) for g in gpu["instance_group"]] == [
        ("KIND_GPU", [0], 2),
        ("KIND_GPU", [1], 1),
    ]
    assert all(
        g["host_policy"] == "numa0" and g["rate_limiter"] == RATE for g in gpu["instance_group"]
    )
    back = build_config(
        _config(_group(kind="KIND_GPU", gpus=[0])), max_batch_size=16, replicas=2, gpus=[]
    )
    (g,) = back["instance_group"]
    assert g["kind"] == "KIND_CPU" and "gpus" not in g and g["name"] == "grp_a"
    empty = dict(_config(), instance_group=[])
    assert build_config(empty, max_batch_size=16, replicas=2)["instance_group"] == [
        {"kind": "KIND_CPU", "count": 2}
    ]


def test_placing_on_gpus_keeps_the_other_groups_and_counts_them() -> None:
    """Several instance groups, placed on GPUs: the first group becomes the per-GPU groups,
    every other group stays exactly and counts toward the replicas (a first group already
    KIND_GPU keeps its own GPUs, as in the other path). Fails if placing on GPUs drops the
    other groups (``return made`` instead of ``made + others``)."""
    second = _group(name="grp_b", kind="KIND_GPU", gpus=[2], count=2, rate_limiter={})
    third = _group(name="grp_c", count=1, host_policy="numa1", rate_limiter={})
    cfg = _config(_group(), second, third)
    before = copy.deepcopy(cfg)
    out = build_config(cfg, max_batch_size=16, replicas=6, gpus=[0, 1], batcher=KEEP_BATCHER)
    assert cfg == before
    groups = out["instance_group"]
    assert [(g["kind"], g["gpus"], g["count"]) for g in groups[:2]] == [
        ("KIND_GPU", [0], 2),
        ("KIND_GPU", [1], 1),
    ]
    assert groups[2:] == [second, third]
    assert instance_count(out) == 6  # 3 inferline's + 2 + 1 the operator's
    with pytest.raises(ValidationError, match=r"m\.replicas"):
        build_config(cfg, max_batch_size=16, replicas=3, gpus=[0, 1], batcher=KEEP_BATCHER)
    on_gpu = _config(_group(kind="KIND_GPU", gpus=[0], count=1), third)
    moved = build_config(on_gpu, max_batch_size=16, replicas=4, gpus=[0, 1])
    assert moved["instance_group"] == [_group(kind="KIND_GPU", gpus=[0], count=3), third]
    assert instance_count(moved) == 4

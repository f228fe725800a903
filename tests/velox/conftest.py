"""Fixtures of the Velox tests: a seeded table and a real Redis server when one is installed."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from _velox_helpers import make_table

from inferline.adapters import free_port
from inferline.velox import FeatureTable


@pytest.fixture
def table() -> FeatureTable:
    return make_table()


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    redis = pytest.importorskip("redis", reason="the redis Python package is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(200):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.025)
        yield url
    finally:
        proc.terminate()
        proc.wait()

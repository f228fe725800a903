"""Start ``inferline serve`` as a child process and wait until it answers.

The demo, the benchmarks and the integration tests use it so they measure and break the real
thing: a separate server process (its own event loop and core) spawning replica processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inferline.core import BackendError

__all__ = ["ServerProcess"]


class ServerProcess:
    """``inferline serve --deployment D [--plan P]`` on a free port of 127.0.0.1.

    Use as a context manager; ``url``, ``pid`` and ``info`` (what the ready file holds) are
    available once started. ``stop()`` sends SIGTERM (graceful: replicas are stopped), then
    SIGKILL after ``grace_s``.
    """

    def __init__(
        self,
        deployment: str | os.PathLike[str],
        plan: str | os.PathLike[str] | None = None,
        *,
        token: str | None = None,
        extra_args: list[str] | None = None,
        start_timeout_s: float = 180.0,
        log_path: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.deployment = str(deployment)
        self.plan = None if plan is None else str(plan)
        self.token = token
        self.extra_args = list(extra_args or [])
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="inferline-serve-")
        self._log: Any = None

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServerProcess:
        ready = Path(self._tmp.name) / "ready.json"
        cmd = [
            sys.executable,
            "-m",
            "inferline",
            "serve",
            "--deployment",
            self.deployment,
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ]
        if self.plan:
            cmd += ["--plan", self.plan]
        env = dict(os.environ)
        env.update(self.env or {})
        if self.token:
            env["INFERLINE_TOKEN"] = self.token
        log = Path(self.log_path) if self.log_path else Path(self._tmp.name) / "server.log"
        self._log_file = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd + self.extra_args, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if ready.exists():
                try:
                    self.info = json.loads(ready.read_text())
                    return self
                except ValueError:
                    pass  # being written
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        rc = self.proc.poll()
        self.stop()
        raise BackendError(
            "inferline serve",
            f"server did not become ready (exit code {rc}); log tail:\n{self.log_tail()}",
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self._log_file.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()

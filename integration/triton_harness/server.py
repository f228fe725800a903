"""Start, stop and restart a real ``tritonserver`` process on free loopback ports."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from inferline.adapters import address_in_use, free_port

from .setup_server import Install

__all__ = ["TritonServer", "free_port"]

log = logging.getLogger(__name__)


class TritonServer:
    """One ``tritonserver`` bound to 127.0.0.1, in explicit model-control mode unless
    ``model_control_mode`` says otherwise (``none``/``poll``: to check that attach refuses it).

    Ports are chosen once, so a restart comes back on the same addresses (clients reconnect);
    only a first start that finds a port taken picks new ones and tries again.
    """

    START_TRIES = 3

    def __init__(
        self,
        install: Install,
        repository: Path,
        load: Sequence[str] = (),
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        model_control_mode: str = "explicit",
    ) -> None:
        if model_control_mode not in ("explicit", "none", "poll"):
            raise ValueError(
                f"model_control_mode: explicit, none or poll, not {model_control_mode!r}"
            )
        self.model_control_mode = model_control_mode
        self.install = install
        self.repository = Path(repository)
        self.load = tuple(load)
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_path or self.repository.parent / "tritonserver.log"
        self.extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh = None
        self._atexit_registered = False

    @property
    def http_url(self) -> str:
        return f"triton://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"triton+grpc://127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        cmd = [
            str(self.install.binary),
            "--model-repository",
            str(self.repository),
            "--backend-directory",
            str(self.install.backends),
            "--model-control-mode",
            self.model_control_mode,
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--allow-gpu-metrics",
            "false",
            "--exit-timeout-secs",
            "5",
            "--pinned-memory-pool-byte-size",
            "0",
        ]
        for name in self.load:  # only explicit mode takes --load-model (others load all)
            cmd += ["--load-model", name] if self.model_control_mode == "explicit" else []
        return cmd + list(self.extra_args)

    def start(self, timeout_s: float = 60.0) -> TritonServer:
        if self._proc is not None and self._proc.poll() is None:
            return self
        first = not self._atexit_registered
        for attempt in range(1, self.START_TRIES + 1):
            mark = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start_once(timeout_s)
            except RuntimeError:
                if not first or attempt == self.START_TRIES:
                    raise
                with open(self.log_path, "rb") as f:
                    f.seek(mark)
                    said = f.read().decode("utf-8", "replace")
                if not address_in_use(said):
                    raise
                log.warning("tritonserver found a port taken; new ports, try %d", attempt + 1)
                self.stop()
                self.http_port, self.grpc_port = free_port(), free_port()
                self.metrics_port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> TritonServer:
        self._log_fh = open(self.log_path, "ab")  # closed in stop()
        self._proc = subprocess.Popen(
            self.command(),
            env=self.install.env(),
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends the stubs too
        )
        if not self._atexit_registered:  # never leave a server behind when Python exits
            atexit.register(self.kill)
            self._atexit_registered = True
        self.wait_ready(timeout_s)
        log.info(
            "tritonserver pid %s ready on http %s grpc %s", self.pid, self.http_port, self.grpc_port
        )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
        while True:
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited early; log: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"tritonserver not ready after {timeout_s}s; log: {self.log_tail()}"
                )
            time.sleep(0.1)

    def _shm_regions(self) -> list[Path]:
        """Shared-memory regions of this server's Python-backend stubs.

        Each stub gets its region's name on its command line (after the model path) and the
        server's pid as its parent. A server that is killed leaves them in /dev/shm.
        """
        if self._proc is None:
            return []
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self._proc.pid and argv and argv[0].endswith(b"triton_python_backend_stub"):
                if len(argv) > 2 and argv[2].startswith(b"triton_python_backend_shm_region_"):
                    out.append(Path("/dev/shm") / argv[2].decode())
        return out

    @staticmethod
    def _unlink(paths: list[Path]) -> None:
        for p in paths:
            try:
                p.unlink()
            except OSError:
                pass

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL of its whole process group if it lingers."""
        regions = self._shm_regions()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._killpg(proc)
        if proc is not None:
            self._killpg(proc)  # stubs left behind in the group
        self._unlink(regions)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def kill(self) -> None:
        """Abrupt death (SIGKILL), as in a crash; its shared-memory regions are removed."""
        regions = self._shm_regions()
        proc, self._proc = self._proc, None
        if proc is not None:
            self._killpg(proc)
        self._unlink(regions)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    @staticmethod
    def _killpg(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def restart(self, timeout_s: float = 60.0, load: Sequence[str] | None = None) -> None:
        self.stop()
        if load is not None:
            self.load = tuple(load)
        self._wait_ports_free()
        self.start(timeout_s)

    def _wait_ports_free(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            while True:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        s.bind(("127.0.0.1", port))
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-n:])

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

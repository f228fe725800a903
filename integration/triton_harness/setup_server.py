"""Fetch and unpack a real Triton Inference Server, and build its model environment.

The only ``tritonserver`` binary on the package registries ships inside the
``nvidia-pytriton==0.7.0`` wheel (Triton 2.51, see ``shared/BACKENDS.md``). This module:

1. downloads that wheel with ``pip download --no-deps`` into ``<repo>/.cache/triton/wheels``;
2. unpacks it (it is a zip; file modes restored) into ``<repo>/.cache/triton/server-0.7.0``;
3. copies the Python-backend stub for the running Python version into ``backends/python``;
4. installs a small separate package folder for the Python-backend models with ``numpy<2``
   (with numpy 2 the stub returns empty outputs), kept apart from the project's environment.

Every step is idempotent (stamp files) and guarded by a file lock, so concurrent test sessions
share one installation. Run as a script to install and print the paths::

    .venv/bin/python integration/triton_harness/setup_server.py
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PYTRITON_VERSION", "Install", "SetupError", "ensure_installed", "repo_root"]

log = logging.getLogger(__name__)

PYTRITON_VERSION = "0.7.0"
MODEL_ENV_REQUIREMENTS = ("numpy<2",)


class SetupError(RuntimeError):
    """The server could not be installed here; the message names what is missing."""


@dataclass(frozen=True)
class Install:
    """Paths of an unpacked Triton server and its model environment."""

    root: Path
    binary: Path
    backends: Path
    lib_dirs: tuple[Path, ...]
    model_site: Path  # site-packages of the model environment (numpy<2)

    def env(self) -> dict[str, str]:
        """Environment for the server process."""
        env = dict(os.environ)
        ld = [str(p) for p in self.lib_dirs]
        if env.get("LD_LIBRARY_PATH"):
            ld.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(ld)
        # The stub's interpreter ignores PYTHONPATH; the models' model.py reads this instead.
        env["INFERLINE_TRITON_SITE"] = str(self.model_site)
        return env

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "binary": str(self.binary),
            "backends": str(self.backends),
            "lib_dirs": [str(p) for p in self.lib_dirs],
            "model_site": str(self.model_site),
        }


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str) -> None:
    log.info("%s: %s", what, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def _download_wheel(wheels: Path) -> Path:
    pattern = f"nvidia_pytriton-{PYTRITON_VERSION}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(wheels),
            f"nvidia-pytriton=={PYTRITON_VERSION}",
        ],
        f"pip download nvidia-pytriton=={PYTRITON_VERSION}",
    )
    found = sorted(wheels.glob(pattern))
    if not found:
        raise SetupError(f"pip download produced no {pattern} in {wheels}")
    return found[0]


def _unpack(wheel: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            zf.extract(info, tmp)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(tmp / info.filename, mode)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _python_lib_dir() -> Path | None:
    """Folder holding the shared libpython of this interpreter, if it has one.

    The stub links ``libpython3.X.so.1.0``; putting this interpreter's own library first makes
    the stub's interpreter match the standard library and the model environment (a mismatch in
    patch release fails with ``'_thread.RLock' object has no attribute '_recursion_count'``).
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    if libdir and (Path(libdir) / f"libpython{ver}.so.1.0").exists():
        return Path(libdir)
    return None


def _build_model_env(env_dir: Path) -> Path:
    """A folder of packages for the models (``pip install --target``), apart from the project's."""
    stamp = env_dir / ".inferline-installed"
    site = env_dir / "site-packages"
    want = json.dumps(list(MODEL_ENV_REQUIREMENTS))
    if stamp.exists() and stamp.read_text() == want and site.is_dir():
        return site
    shutil.rmtree(env_dir, ignore_errors=True)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "--no-compile",
            "--target",
            str(site),
            *MODEL_ENV_REQUIREMENTS,
        ],
        "install the model environment (numpy<2)",
    )
    stamp.write_text(want)
    return site


def ensure_installed(cache_root: Path | None = None) -> Install:
    """Install (once) and return the Triton server and its model environment.

    Raises ``SetupError`` naming what is missing when it cannot be had (no network to the
    registry, unsupported Python version or platform).
    """
    if sys.platform != "linux":
        raise SetupError(
            f"the tritonserver in nvidia-pytriton runs on Linux only, not {sys.platform}"
        )
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    cache = Path(cache_root) if cache_root else repo_root() / ".cache" / "triton"
    server_dir = cache / f"server-{PYTRITON_VERSION}"
    with _locked(cache / ".lock"):
        stamp = server_dir / ".inferline-unpacked"
        if not stamp.exists():
            wheel = _download_wheel(cache / "wheels")
            _unpack(wheel, server_dir)
            stamp.write_text(wheel.name)
        ts = server_dir / "pytriton" / "tritonserver"
        stub_src = ts / "python_backend_stubs" / ver / "triton_python_backend_stub"
        if not stub_src.exists():
            raise SetupError(
                f"nvidia-pytriton {PYTRITON_VERSION} has no Python-backend stub for Python {ver}"
            )
        stub_dst = ts / "backends" / "python" / "triton_python_backend_stub"
        if not stub_dst.exists() or stub_dst.stat().st_size != stub_src.stat().st_size:
            shutil.copy2(stub_src, stub_dst)
        site = _build_model_env(cache / f"modelenv-py{ver}")
    libs: list[Path] = []
    pylib = _python_lib_dir()
    if pylib is not None:
        libs.append(pylib)
    libs.append(server_dir / "nvidia_pytriton.libs")
    inst = Install(
        root=server_dir,
        binary=ts / "bin" / "tritonserver",
        backends=ts / "backends",
        lib_dirs=tuple(libs),
        model_site=site,
    )
    for exe in (inst.binary, stub_dst):
        missing = _missing_libraries(exe, inst.env())
        if missing:
            raise SetupError(f"{exe.name} cannot find the shared libraries {missing}")
    return inst


def _missing_libraries(exe: Path, env: dict[str, str]) -> list[str]:
    """Libraries ``ldd`` reports as not found (e.g. no shared libpython3.X); [] without ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    proc = subprocess.run([ldd, str(exe)], env=env, capture_output=True, text=True, check=False)
    return [ln.split()[0] for ln in proc.stdout.splitlines() if "not found" in ln]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        inst = ensure_installed()
    except SetupError as e:
        print(f"triton setup failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(inst.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TF Serving for the integration tests: the real ``tensorflow_model_server`` when one is on
PATH (or named by ``$TENSORFLOW_MODEL_SERVER``), else a STAND-IN with the same REST routes and
gRPC services (``_server``), labelled as such everywhere (``ServerKind.label``).

``TFServer`` starts one server process on free loopback ports and can kill and restart it on
the same ports. ``model_command()`` is the command the adapter's ``launch=`` mode runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from inferline.adapters import address_in_use, free_port
from inferline.adapters.tfserving import ServedModel, find_model_server, format_text

from ._models import save_dense_model

__all__ = ["Digits", "TFServer", "export_model", "free_port", "server_command", "server_kind"]

_MAIN = Path(__file__).with_name("__main__.py")


def server_kind() -> str:
    """``"real"`` when a tensorflow_model_server binary is available, else ``"standin"``."""
    return "real" if find_model_server() else "standin"


def server_command() -> list[str]:
    """The command that starts a server of ``server_kind()``."""
    real = find_model_server()
    return real if real else [sys.executable, str(_MAIN)]


def export_model(
    base_path: Path, version: int, layers: list[tuple[np.ndarray, np.ndarray]]
) -> Path:
    """A dense classifier in the format the server of ``server_kind()`` loads: a SavedModel
    for the real server (needs TensorFlow), the stand-in's npz format otherwise."""
    if server_kind() == "standin":
        return save_dense_model(base_path, version, layers)
    import tensorflow as tf  # only with a real server: SavedModels need TensorFlow

    ws = [(tf.constant(w, tf.float32), tf.constant(b, tf.float32)) for w, b in layers]

    class Dense(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, layers[0][0].shape[0]], tf.float32)])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            h = x
            for i, (w, b) in enumerate(ws):
                h = tf.matmul(h, w) + b
                if i < len(ws) - 1:
                    h = tf.nn.relu(h)
            p = tf.nn.softmax(h)
            return {"probabilities": p, "classes": tf.argmax(p, axis=1)}

    m = Dense()
    d = Path(base_path) / str(version)
    tf.saved_model.save(m, str(d), signatures={"serving_default": m.serve})
    return d


class TFServer:
    """One server process (real or stand-in) on 127.0.0.1, same ports across restarts."""

    def __init__(
        self,
        workdir: Path,
        models: Sequence[ServedModel] = (),
        *,
        config_text: str | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kind = server_kind()
        self.grpc_port = free_port()
        self.rest_port = free_port()
        self.config_file = self.workdir / f"models-{self.rest_port}.conf"
        # config_text: an operator's own file, written as is
        self.config_file.write_text(config_text or format_text(list(models)))
        self.flags = list(flags)
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False
        self.log = self.workdir / f"server-{self.rest_port}.log"

    @property
    def rest(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float = 60.0) -> TFServer:
        """Start and wait until it answers; a first start that finds a port taken picks
        new ports and tries again (up to three times). A restart keeps its ports."""
        first, self._started = not self._started, True
        for attempt in range(3):
            mark = self.log.stat().st_size if self.log.exists() else 0
            try:
                return self._start_once(timeout_s)
            except RuntimeError:
                said = self.log.read_bytes()[mark:].decode("utf-8", "replace")
                if not first or attempt == 2 or not address_in_use(said):
                    raise
                self.stop()
                self.grpc_port, self.rest_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> TFServer:
        cmd = [
            *server_command(),
            f"--port={self.grpc_port}",
            f"--rest_api_port={self.rest_port}",
            f"--model_config_file={self.config_file}",
            *self.flags,
        ]
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://{self.rest}/v1/models/__probe__", timeout=1)
            except urllib.error.HTTPError:
                return self  # a 404 means it answers
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} TF Serving exited: {self.log.read_text()[-800:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind} TF Serving not ready in {timeout_s} s")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> TFServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Digits:
    """Two digits classifiers trained here (multinomial logistic regression and a small MLP),
    exported for the server of ``server_kind()`` under ``root``."""

    def __init__(self, root: Path) -> None:
        import warnings

        from sklearn.datasets import load_digits
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import train_test_split
        from sklearn.neural_network import MLPClassifier

        warnings.simplefilter("ignore", ConvergenceWarning)  # few iterations keep the suite fast
        x, y = load_digits(return_X_y=True)
        x = (x / 16.0).astype(np.float32)
        xtr, self.x, ytr, self.y = train_test_split(x, y, test_size=0.3, random_state=0)
        self.lr = LogisticRegression(max_iter=60).fit(xtr, ytr)
        self.mlp = MLPClassifier((32,), max_iter=60, random_state=0).fit(xtr, ytr)
        self.paths = {"digits_lr": root / "digits_lr", "digits_mlp": root / "digits_mlp"}
        export_model(self.paths["digits_lr"], 1, [(self.lr.coef_.T, self.lr.intercept_)])
        export_model(
            self.paths["digits_mlp"],
            1,
            list(zip(self.mlp.coefs_, self.mlp.intercepts_, strict=True)),
        )

    def served(self, *names: str) -> list[ServedModel]:
        return [ServedModel(n, str(self.paths[n])) for n in names]

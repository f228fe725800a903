"""Small model containers for the bundled runtime: examples, benchmarks and tests use them.

A container is any object with ``predict_batch(inputs: list) -> list`` (one output per input)
and an optional ``load()``; deployments name a factory by import path, e.g.
``ModelSpec("noop", source="inferline.adapters.local.examples:noop")``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Linear",
    "Sleep",
    "TorchMLP",
    "crashing",
    "failing",
    "linear",
    "noop",
    "probe",
    "scale",
    "sleep",
    "torch_mlp",
    "wrong_count",
]


class _NoOp:
    """Returns its inputs unchanged (measures runtime and RPC overhead)."""

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)


def noop() -> _NoOp:
    return _NoOp()


class _Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return [np.asarray(x) * self.factor for x in inputs]


def scale(factor: float = 2.0) -> _Scale:
    """Multiplies each numeric input by ``factor``."""
    return _Scale(factor)


class Sleep:
    """Busy for ``base_s + per_item_s * len(batch)`` per batch; answers ``{"pid", "n", "x"}``.

    ``spin=True`` burns CPU instead of sleeping (for profiling under contention).
    ``wake_s``: a batch that starts more than ``idle_after_s`` after the previous one ended
    takes that much longer (a cold path of known size, for testing the wake-up profile).
    ``slow_after_s`` / ``slow_factor``: once that many seconds have passed since the
    container was loaded, every batch takes ``slow_factor`` times longer (a model that slows
    down mid-run, for testing the drift loop; off by default). ``slow_flag``: a file path;
    once it exists every replica is slow, those loaded later included (``slow_after_s`` is
    counted per replica, so a replica a re-plan adds starts fast again: a model that is
    itself changing, which a drift test cannot tell from the loop's own swings).
    """

    def __init__(
        self,
        base_s: float = 0.01,
        per_item_s: float = 0.0,
        spin: bool = False,
        wake_s: float = 0.0,
        idle_after_s: float = 0.01,
        slow_after_s: float = 0.0,
        slow_factor: float = 1.0,
        slow_flag: str = "",
    ) -> None:
        self.base_s = base_s
        self.per_item_s = per_item_s
        self.spin = spin
        self.wake_s = wake_s
        self.idle_after_s = idle_after_s
        self._ended = -float("inf")
        self.slow_after_s = slow_after_s
        self.slow_factor = slow_factor
        self.slow_flag = slow_flag
        self._slow = False  # the flag seen once: slow from then on without another stat
        self._loaded = time.perf_counter()

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        dt = self.base_s + self.per_item_s * len(inputs)
        if self.wake_s and time.perf_counter() - self._ended > self.idle_after_s:
            dt += self.wake_s
        if self.slow_factor != 1.0 and self._is_slow():
            dt *= self.slow_factor
        if self.spin:
            end = time.perf_counter() + dt
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(dt)
        self._ended = time.perf_counter()
        pid = os.getpid()
        return [{"pid": pid, "n": len(inputs), "x": x if _jsonable(x) else None} for x in inputs]

    def _is_slow(self) -> bool:
        if not self._slow:
            if self.slow_flag:
                self._slow = os.path.exists(self.slow_flag)
            else:
                self._slow = time.perf_counter() - self._loaded >= self.slow_after_s
        return self._slow


def _jsonable(x: Any) -> bool:
    return x is None or isinstance(x, bool | int | float | str)


sleep = Sleep  # the factory a deployment names (``examples:sleep``) is the class itself


class Work:
    """A fixed amount of CPU work per item (``rounds`` of integer arithmetic), unlike
    ``Sleep(spin=True)``, which spins until a wall-clock deadline: a replica that shares its
    core with another busy one takes longer, as real CPU-bound models do. Answers ``n``."""

    def __init__(self, rounds: int = 20_000) -> None:
        self.rounds = int(rounds)

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        acc = 0
        for _ in range(self.rounds * len(inputs)):
            acc = (acc * 31 + 7) % 1_000_003
        return [{"n": len(inputs), "acc": acc} for _ in inputs]


work = Work


class _Failing:
    """Raises for any batch that contains the input ``"fail"``; else echoes."""

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        if any(isinstance(x, str) and x == "fail" for x in inputs):
            raise RuntimeError("asked to fail")
        return [ValueError(f"bad item {x!r}") if x == "bad" else x for x in inputs]


def failing() -> _Failing:
    return _Failing()


class _WrongCount:
    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return [*inputs, None]


def wrong_count() -> _WrongCount:
    """Returns one output too many: the runtime must report it as a BackendError."""
    return _WrongCount()


class _Crashing:
    def __init__(self, at_load: bool) -> None:
        self.at_load = at_load

    def load(self) -> None:
        if self.at_load:
            raise RuntimeError("container refuses to load")

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        if "crash" in [x for x in inputs if isinstance(x, str)]:
            os._exit(17)  # a hard crash, as a segfaulting native library would
        return list(inputs)


def crashing(at_load: bool = False) -> _Crashing:
    """Exits the process on the input ``"crash"`` (or fails ``load()`` with ``at_load``)."""
    return _Crashing(at_load)


class _Probe:
    """Answers, for every input, where it runs: pid, pinned cores, thread and GPU settings
    (and torch's thread count when built with ``import_torch=True``)."""

    def __init__(self, import_torch: bool = False) -> None:
        self.import_torch = import_torch

    def load(self) -> None:
        if self.import_torch:
            import torch  # noqa: F401  (the runtime sets its thread count after load())

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        try:
            cores = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cores = []
        info = {
            "pid": os.getpid(),
            "cores": cores,
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "mkl": os.environ.get("MKL_NUM_THREADS"),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        if self.import_torch:
            import torch

            info["torch_threads"] = torch.get_num_threads()
        return [info for _ in inputs]


def probe(import_torch: bool = False) -> _Probe:
    return _Probe(import_torch)


class Linear:
    """A linear classifier ``argmax(x @ W + b)`` whose weights come from ``.npy`` files.

    Weights are saved with ``numpy.save`` and loaded with ``allow_pickle=False`` (no pickle on
    any path). Inputs are 1-d feature vectors; outputs are the class index (``int``), or the
    scores too with ``scores=True``.
    """

    def __init__(self, weights: str, bias: str, scores: bool = False) -> None:
        self.weights_path = Path(weights)
        self.bias_path = Path(bias)
        self.scores = scores
        self._w: np.ndarray | None = None
        self._b: np.ndarray | None = None

    def load(self) -> None:
        self._w = np.load(self.weights_path, allow_pickle=False)
        self._b = np.load(self.bias_path, allow_pickle=False)

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        assert self._w is not None and self._b is not None, "load() was not called"
        x = np.stack([np.asarray(v, dtype=self._w.dtype).reshape(-1) for v in inputs])
        s = x @ self._w + self._b
        labels = s.argmax(axis=1)
        if self.scores:
            return [{"label": int(k), "scores": row} for k, row in zip(labels, s, strict=True)]
        return [int(k) for k in labels]


def linear(weights: str, bias: str, scores: bool = False) -> Linear:
    return Linear(weights, bias, scores)


class TorchMLP:
    """A torch MLP classifier with seeded random weights (or a ``state_dict`` saved with
    ``torch.save`` and read with ``weights_only=True``); runs on CUDA when the replica was
    given a GPU. Inputs are feature vectors; outputs are class indices."""

    def __init__(
        self,
        in_dim: int = 64,
        hidden: int = 128,
        classes: int = 10,
        seed: int = 0,
        weights: str = "",
    ) -> None:
        self.in_dim, self.hidden, self.classes = in_dim, hidden, classes
        self.seed, self.weights = seed, weights
        self._net: Any = None
        self._device = "cpu"

    def load(self) -> None:
        import torch

        torch.manual_seed(self.seed)
        net = torch.nn.Sequential(
            torch.nn.Linear(self.in_dim, self.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(self.hidden, self.classes),
        )
        if self.weights:
            net.load_state_dict(torch.load(self.weights, weights_only=True))
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        self._net = net.to(self._device).eval()

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        import torch

        x = torch.as_tensor(
            np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for v in inputs]),
            device=self._device,
        )
        with torch.inference_mode():
            return self._net(x).argmax(dim=1).cpu().tolist()


def torch_mlp(
    in_dim: int = 64, hidden: int = 128, classes: int = 10, seed: int = 0, weights: str = ""
) -> TorchMLP:
    return TorchMLP(in_dim, hidden, classes, seed, weights)

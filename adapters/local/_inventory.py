"""CPU-core and GPU inventory of the bundled runtime: who holds which core and device.

A CPU replica of a model with ``threads = k`` holds ``k`` cores (pinned with CPU affinity); a
GPU replica holds one device plus ``k`` cores for its host-side work. Without
``oversubscribe`` a request that does not fit is refused with a ``CapacityError`` that says
what is free; with it, the least-used cores and devices are shared round-robin.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from inferline.core import MAX_SHARERS_PER_UNIT, CapacityError

__all__ = ["Inventory", "Placement", "detect_cores", "detect_gpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """The resources one replica slot holds."""

    cores: tuple[int, ...]
    gpu: str | None = None


def detect_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity API, assume all cores
        return list(range(os.cpu_count() or 1))


def detect_gpus() -> list[str]:
    """GPU ids from ``nvidia-smi -L`` (respecting ``CUDA_VISIBLE_DEVICES``), or none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return re.findall(r"^GPU (\d+):", out.stdout, flags=re.M)


MAX_USERS_PER_CORE = MAX_SHARERS_PER_UNIT  # replica threads per core when oversubscribing


class Inventory:
    """Allocation bookkeeping over a fixed set of cores and GPUs (not thread-safe; one loop)."""

    def __init__(
        self,
        cores: Sequence[int],
        gpus: Sequence[str],
        gpu_kind: str,
        oversubscribe: bool = False,
    ) -> None:
        if not cores:
            raise CapacityError("the local backend needs at least one CPU core", {})
        self.cores = tuple(sorted(set(int(c) for c in cores)))
        self.gpus = tuple(str(g) for g in gpus)
        self.gpu_kind = gpu_kind
        self.oversubscribe = oversubscribe
        self._core_users = {c: 0 for c in self.cores}
        self._gpu_users = {g: 0 for g in self.gpus}

    # -- views ------------------------------------------------------------------------------

    def inventory(self) -> dict[str, int]:
        inv = {"cpu": len(self.cores)}
        if self.gpus:
            inv[self.gpu_kind] = len(self.gpus)
        return inv

    def free(self) -> dict[str, int]:
        free = {"cpu": sum(1 for n in self._core_users.values() if n == 0)}
        if self.gpus:
            free[self.gpu_kind] = sum(1 for n in self._gpu_users.values() if n == 0)
        return free

    def describe_free(self) -> str:
        free_cores = [c for c, n in self._core_users.items() if n == 0]
        parts = [f"cpu={len(free_cores)} (cores {free_cores})"]
        if self.gpus:
            free_gpus = [g for g, n in self._gpu_users.items() if n == 0]
            parts.append(f"{self.gpu_kind}={len(free_gpus)} (devices {free_gpus})")
        return ", ".join(parts)

    def is_gpu(self, hardware: str) -> bool:
        return hardware == self.gpu_kind

    # -- allocation -------------------------------------------------------------------------

    def allocate(self, model: str, hardware: str, threads: int, count: int) -> list[Placement]:
        """Placements for ``count`` replicas, all or nothing."""
        if hardware != "cpu" and hardware != self.gpu_kind:
            raise CapacityError(
                f"model {model!r}: hardware {hardware!r} is not in this backend's inventory "
                f"{self.inventory()!r}; free: {self.describe_free()}",
                self.free(),
            )
        gpu = self.is_gpu(hardware)
        if gpu and not self.gpus:
            raise CapacityError(
                f"model {model!r}: no {hardware!r} devices in this backend; "
                f"free: {self.describe_free()}",
                self.free(),
            )
        need_cores = threads * count
        free_cores = [c for c, n in self._core_users.items() if n == 0]
        free_gpus = [g for g, n in self._gpu_users.items() if n == 0]
        short = need_cores > len(free_cores) or (gpu and count > len(free_gpus))
        if short and not self.oversubscribe:
            want = f"{need_cores} cpu cores"
            if gpu:
                want += f" and {count} {hardware} devices"
            raise CapacityError(
                f"model {model!r}: {count} replica(s) x {threads} thread(s) need {want}; "
                f"free: {self.describe_free()} (pass oversubscribe=True to share them)",
                self.free(),
            )
        if short and (sum(self._core_users.values()) + need_cores) > MAX_USERS_PER_CORE * len(
            self.cores
        ):
            # oversubscription shares cores, but without a bound a plan (PUT /admin/plan) could
            # fork replicas until the machine stops
            raise CapacityError(
                f"model {model!r}: {count} more replica(s) x {threads} thread(s) would put more "
                f"than {MAX_USERS_PER_CORE} replica threads on each of the {len(self.cores)} "
                f"cores; free: {self.describe_free()}",
                self.free(),
            )
        if short:
            log.warning(
                "oversubscribing: model %r gets %d replica(s) x %d thread(s) on %s with %s free; "
                "cores/devices are shared round-robin",
                model,
                count,
                threads,
                hardware,
                self.describe_free(),
            )
        out = []
        for _ in range(count):
            cores = self._take_cores(min(threads, len(self.cores)))
            dev = self._take_gpu() if gpu else None
            out.append(Placement(cores, dev))
        return out

    def _take_cores(self, k: int) -> tuple[int, ...]:
        # Least-used first, lowest id on ties: with no oversubscription that is simply free cores.
        chosen = sorted(self.cores, key=lambda c: (self._core_users[c], c))[:k]
        for c in chosen:
            self._core_users[c] += 1
        return tuple(sorted(chosen))

    def _take_gpu(self) -> str:
        g = min(self.gpus, key=lambda d: (self._gpu_users[d], self.gpus.index(d)))
        self._gpu_users[g] += 1
        return g

    def release(self, p: Placement) -> None:
        for c in p.cores:
            if self._core_users.get(c, 0) > 0:
                self._core_users[c] -= 1
        if p.gpu is not None and self._gpu_users.get(p.gpu, 0) > 0:
            self._gpu_users[p.gpu] -= 1

"""Tensor payloads over the bundled runtime's gRPC: round-trip time and bandwidth by size.

What is measured: ``LocalReplica.predict_batch`` on one replica process of the ``scale``
example (returns its float32 input times 1.0, so the same bytes travel back), for several
tensor shapes and batch sizes: the median of ``--repeats`` calls after one warm-up call. The
bandwidth counts the bytes of both directions. A batch whose request exceeds the backend's
``max_message_bytes`` (64 MiB by default) is refused with an error that names the limit; the
table says so instead of a time. Run: ``.venv/bin/python benchmarks/local_payload.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time

import numpy as np

from inferline.adapters.local import LocalBackend
from inferline.core import BackendError, ModelConfig, ModelSpec

SHAPES: tuple[tuple[int, ...], ...] = ((8,), (224, 224, 3), (512, 512, 3), (1024, 1024, 4))
BATCHES = (1, 8)


async def measure(
    shapes: tuple[tuple[int, ...], ...], batches: tuple[int, ...], repeats: int
) -> list[dict[str, object]]:
    backend = LocalBackend(oversubscribe=True)
    rows: list[dict[str, object]] = []
    try:
        spec = ModelSpec("echo", "inferline.adapters.local.examples:scale", {"factor": 1.0})
        await backend.deploy(spec, ModelConfig("cpu", max(batches), 1))
        replica = backend.replicas("echo")[0]
        rng = np.random.default_rng(0)
        for shape in shapes:
            x = rng.random(shape, dtype=np.float32)
            for b in batches:
                row: dict[str, object] = {"shape": shape, "batch": b, "mb": x.nbytes * b / 1e6}
                try:
                    out = await replica.predict_batch([x] * b)
                    assert np.array_equal(out[0], x)  # the bytes came back intact
                    times = []
                    for _ in range(repeats):
                        t = time.perf_counter()
                        await replica.predict_batch([x] * b)
                        times.append(time.perf_counter() - t)
                    row["ms"] = statistics.median(times) * 1e3
                except BackendError as e:
                    row["refused"] = str(e).split("(message limit")[-1].strip(" )") or str(e)
                rows.append(row)
    finally:
        await backend.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two shapes, batch 1, 3 repeats")
    ap.add_argument("--smoke", action="store_true", help="the same as --quick (a few seconds)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=10,
        help="timed calls per point; the median is reported (default %(default)s)",
    )
    args = ap.parse_args(argv)
    args.quick |= args.smoke
    shapes = SHAPES[:2] if args.quick else SHAPES
    batches = (1,) if args.quick else BATCHES
    repeats = 3 if args.quick else args.repeats
    rows = asyncio.run(measure(shapes, batches, repeats))
    print(f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}")
    print(f"{'shape':>16} {'batch':>5} {'MB each way':>12} {'ms per call':>12} {'MB/s (both)':>12}")
    for r in rows:
        head = f"{r['shape']!s:>16} {r['batch']:>5} {r['mb']:>12.2f}"
        if "ms" in r:
            ms = float(r["ms"])  # type: ignore[arg-type]
            rate = 2 * float(r["mb"]) / (ms / 1e3)  # type: ignore[arg-type]
            print(f"{head} {ms:>12.2f} {rate:>12.0f}")
        else:
            print(f"{head}   refused: over the message limit of {r['refused']}")
    print(
        "reproduce: .venv/bin/python benchmarks/local_payload.py"
        + (" --smoke" if args.smoke else " --quick" if args.quick else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

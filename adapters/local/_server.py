"""One replica process of the bundled runtime: loads a model container and serves it over gRPC.

Run by ``LocalBackend`` as ``python -m inferline.adapters.local.replica CONFIG_JSON`` (that
module only calls ``main`` here, so the package never imports the ``-m`` target itself); not
meant to be run by hand, though it can be (``--help``). ``CONFIG_JSON`` holds ``model``,
``replica``, ``source`` (``package.module:factory``), ``params``, ``threads``, ``cores`` (or
null), ``parent_pid``, ``pdeathsig`` and ``max_message_bytes``.

Protocol with the parent: after the container is loaded and the server listens, one line
``INFERLINE-READY {"port": ..., "pid": ..., "load_s": ...}`` on stdout (then stdout is pointed at
stderr so the container's own prints cannot fill the pipe), or ``INFERLINE-ERROR {"type",
"message"}`` and exit code 3 when loading fails. The process exits when its parent dies (Linux
parent-death signal, and a watch on the parent pid everywhere) and on SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent import futures
from typing import Any

log = logging.getLogger("inferline.adapters.local.replica")

READY = "INFERLINE-READY "
ERROR = "INFERLINE-ERROR "
_PR_SET_PDEATHSIG = 1


def load_container(source: str, params: dict[str, Any], threads: int) -> Any:
    """Import ``package.module:factory``, call it with ``params`` and ``load()`` the result."""
    mod_name, sep, attr = source.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"source must look like 'package.module:factory', got {source!r}")
    module = importlib.import_module(mod_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part)
    _set_torch_threads(threads)
    container = factory(**params)
    if not callable(getattr(container, "predict_batch", None)):
        raise TypeError(f"{source} returned {type(container).__name__}, which has no predict_batch")
    load = getattr(container, "load", None)
    if callable(load):
        load()
    _set_torch_threads(threads)  # the factory or load() may have imported torch just now
    return container


def _set_torch_threads(threads: int) -> None:
    torch = sys.modules.get("torch")  # never import torch just for this: it costs seconds
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.set_num_threads(threads)


def _as_outputs(out: Any) -> list[Any] | None:
    if isinstance(out, str | bytes | dict) or not hasattr(out, "__len__"):
        return None
    try:
        return list(out)
    except TypeError:
        return None


def run_container(container: Any, inputs: list[Any]) -> tuple[list[Any] | None, int]:
    """The container's outputs for a batch (None for a non-sequence), and how many times it
    failed. When it fails a batch of several inputs, each input runs alone (only then), so a
    bad input fails by itself and the good ones of the batch still get outputs, as the backend
    contract asks: one output or error per input. Callers hold the container's lock."""
    if not inputs:
        return [], 0
    try:
        return _as_outputs(container.predict_batch(inputs)), 0
    except Exception as e:  # the container failed the whole batch
        if len(inputs) == 1:
            log.warning("model failed a batch of 1: %r", e)
            return [e], 1
        log.warning("model failed a batch of %d (%r): each input runs alone", len(inputs), e)
    outs: list[Any] = []
    for x in inputs:
        try:
            one = _as_outputs(container.predict_batch([x]))
        except Exception as e:
            outs.append(e)
            continue
        if one is None or len(one) != 1:
            return one, 1
        outs.append(one[0])
    return outs, 1


class ContainerStats:
    def __init__(self) -> None:
        self.batches = 0
        self.items = 0
        self.errors = 0
        self.service_s: deque[float] = deque(maxlen=10_000)
        self.started_at = time.time()
        self.load_s = 0.0

    def to_dict(self) -> dict[str, Any]:
        s = sorted(self.service_s)

        def pct(p: float) -> float | None:
            if not s:
                return None
            return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]

        return {
            "batches": self.batches,
            "items": self.items,
            "batch_errors": self.errors,
            "service_mean_s": (sum(s) / len(s)) if s else None,
            "service_p50_s": pct(50),
            "service_p99_s": pct(99),
            "service_max_s": s[-1] if s else None,
            "started_at": self.started_at,
            "load_s": self.load_s,
        }


def _make_servicer(
    container: Any,
    cfg: dict[str, Any],
    stats: ContainerStats,
    lock: threading.Lock | None = None,
    busy: threading.Event | None = None,
) -> Any:
    from inferline.core import encode_error

    from . import _convert
    from . import replica_pb2 as pb
    from . import replica_pb2_grpc as pbg

    model = cfg["model"]
    # containers need not be thread-safe; the queue sends one at a time. A caller that runs
    # the container another way too (a Ray actor's own method) passes its lock and flag.
    lock = threading.Lock() if lock is None else lock
    busy = threading.Event() if busy is None else busy

    class Servicer(pbg.ReplicaServicer):
        def PredictBatch(self, request: Any, context: Any) -> Any:
            resp = pb.PredictResponse()
            n = len(request.inputs)
            inputs: list[Any] = []
            bad: dict[int, BaseException] = {}
            for i, v in enumerate(request.inputs):
                try:
                    inputs.append(_convert.from_pb(v, f"inputs[{i}]"))
                except Exception as e:  # a malformed item fails alone
                    bad[i] = e
            good = [x for i, x in enumerate(inputs) if i not in bad] if bad else inputs
            with lock:
                busy.set()
                t0 = time.perf_counter()
                try:
                    outs, failed = run_container(container, good)
                finally:
                    dt = time.perf_counter() - t0
                    busy.clear()
            resp.service_s = dt
            stats.batches += 1
            stats.items += n
            stats.service_s.append(dt)
            stats.errors += failed
            if outs is None or len(outs) != len(good):
                stats.errors += 1
                got = "a non-sequence" if outs is None else f"{len(outs)} outputs"
                resp.batch_error.type = "BackendError"
                resp.batch_error.message = (
                    f"model {model!r} returned {got} for a batch of {len(good)} inputs"
                )
                return resp
            if bad:
                it = iter(outs)
                outs = [bad[i] if i in bad else next(it) for i in range(n)]
            for o in outs:
                if isinstance(o, BaseException):
                    _convert._dict_to_pb(encode_error(o), resp.outputs.add())
                else:
                    _convert.to_pb(o, resp.outputs.add())
            return resp

        def Ping(self, request: Any, context: Any) -> Any:
            return pb.PingResponse(pid=os.getpid(), busy=busy.is_set())

        def Info(self, request: Any, context: Any) -> Any:
            d = stats.to_dict()
            d.update(cores=cfg.get("cores"), threads=cfg.get("threads"), pid=os.getpid())
            return pb.InfoResponse(
                model=model, replica=cfg["replica"], pid=os.getpid(), stats_json=json.dumps(d)
            )

    return Servicer()


def _arm_parent_death(cfg: dict[str, Any]) -> None:
    if cfg.get("pdeathsig") and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != cfg["parent_pid"]:  # the parent died before the signal was armed
        os._exit(0)


def _pin(cfg: dict[str, Any]) -> None:
    cores: Sequence[int] | None = cfg.get("cores")
    if cores:
        try:
            os.sched_setaffinity(0, set(cores))
        except (AttributeError, OSError) as e:  # not Linux, or cores outside our cpuset
            log.warning("could not pin replica to cores %s: %s", list(cores), e)


TOKEN_ENV = "INFERLINE_REPLICA_TOKEN"


class _TokenCheck:
    """A gRPC server interceptor: every call must carry ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        import grpc

        self._want = f"Bearer {token}".encode()

        def deny(request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong replica token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        for k, v in details.invocation_metadata or ():
            if k == "authorization" and hmac.compare_digest(v.encode(), self._want):
                return continuation(details)
        return self._deny


def serve_grpc(
    container: Any,
    cfg: dict[str, Any],
    stats: ContainerStats,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    lock: threading.Lock | None = None,
    busy: threading.Event | None = None,
) -> tuple[Any, int]:
    """Serve the replica service for a loaded ``container`` on ``host`` (a port the OS picks):
    ``(started grpc.Server, port)``. ``token``: every call must carry it; ``lock``/``busy``:
    shared with another caller of the container (see ``_make_servicer``)."""
    import grpc

    from . import replica_pb2_grpc as pbg

    limit = int(cfg.get("max_message_bytes", 64 << 20))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="replica"),
        interceptors=[_TokenCheck(token)] if token else [],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    pbg.add_ReplicaServicer_to_server(_make_servicer(container, cfg, stats, lock, busy), server)
    bind = f"[{host}]" if ":" in host else host
    port = server.add_insecure_port(f"{bind}:0")
    if port == 0:
        raise OSError(f"could not bind a port on {host}")
    server.start()
    return server, port


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cfg = json.loads(argv[0])
    logging.basicConfig(
        level=cfg.get("log_level", "WARNING"),
        format=f"%(asctime)s replica {cfg['replica']} %(levelname)s %(message)s",
    )
    _arm_parent_death(cfg)
    _pin(cfg)
    stats = ContainerStats()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # popped: the model's code and anything it starts need not see it
    token = os.environ.pop(TOKEN_ENV, None)
    t0 = time.perf_counter()
    try:
        container = load_container(cfg["source"], dict(cfg.get("params") or {}), cfg["threads"])
        stats.load_s = time.perf_counter() - t0

        server, port = serve_grpc(container, cfg, stats, token=token)
    except BaseException as e:  # report why, then exit: the parent decides about restarts
        msg = {"type": type(e).__name__, "message": str(e)}
        sys.stdout.write(ERROR + json.dumps(msg) + "\n")
        sys.stdout.flush()
        return 3
    ready = {"port": port, "pid": os.getpid(), "load_s": stats.load_s}
    sys.stdout.write(READY + json.dumps(ready) + "\n")
    sys.stdout.flush()
    # From here on the parent no longer reads stdout; send stray prints to stderr instead.
    with contextlib.suppress(OSError):
        os.dup2(2, 1)
    parent = cfg["parent_pid"]
    while not stop.wait(0.25):
        if os.getppid() != parent:  # orphaned (parent crashed): nobody will ever call us
            break
    server.stop(grace=1.0).wait(2.0)
    return 0

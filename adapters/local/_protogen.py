"""Regenerates ``replica_pb2.py``, ``replica_pb2_grpc.py`` and ``replica_pb2.pyi`` from
``replica.proto`` (needs the ``dev`` extra's grpcio-tools)::

    .venv/bin/python -m inferline.adapters.local._protogen

After running protoc it makes two edits so the committed code works with every grpcio and
protobuf release the project supports, not only the generating one: the import of
``replica_pb2`` becomes relative (the module lives in a package), and the exact-version guards
protoc emits are removed (the serialized-descriptor form the code uses is read by protobuf >= 4.21
and the stubs use only long-stable grpc calls).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from grpc_tools import protoc  # dev-only dependency

    args = [
        "protoc",
        f"-I{HERE}",
        f"--python_out={HERE}",
        f"--grpc_python_out={HERE}",
        f"--pyi_out={HERE}",
        str(HERE / "replica.proto"),
    ]
    rc = protoc.main(args)
    if rc != 0:
        return int(rc)
    pb2 = HERE / "replica_pb2.py"
    text = pb2.read_text()
    text = text.replace("from google.protobuf import runtime_version as _runtime_version\n", "")
    text = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "", text)
    pb2.write_text(text)
    grpc_mod = HERE / "replica_pb2_grpc.py"
    text = grpc_mod.read_text()
    text = text.replace("import replica_pb2 as", "from . import replica_pb2 as")
    text = re.sub(
        r"GRPC_GENERATED_VERSION = .*?\n\n\n",
        "",
        text,
        flags=re.S,
    )
    grpc_mod.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

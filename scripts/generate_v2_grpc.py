"""Regenerate ``ota_server/inference/edgesdk_v2_grpc_pb2.py`` (and its ``.pyi``) from ``edgesdk_v2_grpc.proto``.

    python scripts/generate_v2_grpc.py           # rewrite the generated files
    python scripts/generate_v2_grpc.py --check   # exit 1 if they differ from what the .proto gives

protoc comes from ``grpcio-tools`` in a virtualenv of its own under ``~/.cache/edgesdk/venvs``
(``$EDGESDK_GRPC_TOOLS_VENV`` overrides), not from edgesdk's environment: the newest
grpcio-tools requires the newest protobuf major, which the dev tools (tritonclient) refuse. The
pinned version writes code that needs protobuf >= :data:`GENCODE_PROTOBUF` at run time, which is
the floor of the ``[server]`` extra's protobuf.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.shared.peer_venv import PeerVenv  # noqa: E402  (the repository root is on the path from here on)

GRPC_TOOLS = "grpcio-tools==1.76.0"
#: The protobuf runtime the generated code checks for (grpcio-tools 1.76.0 bundles protoc 31.1).
GENCODE_PROTOBUF = "6.31.1"
FOLDER = ROOT / "ota_server" / "inference"
PROTO = "edgesdk_v2_grpc.proto"
OUTPUTS = ("edgesdk_v2_grpc_pb2.py", "edgesdk_v2_grpc_pb2.pyi")
VENV = PeerVenv.named("grpc-tools-1.76.0", (GRPC_TOOLS,), "import grpc_tools.protoc", "EDGESDK_GRPC_TOOLS_VENV")


def generate(into: Path) -> None:
    """Run protoc on the .proto, writing the Python module and its type stub into ``into``."""
    VENV.ensure()
    subprocess.run([str(VENV.python), "-m", "grpc_tools.protoc", f"-I{FOLDER}", f"--python_out={into}",
                    f"--pyi_out={into}", str(FOLDER / PROTO)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [name for name in OUTPUTS
                 if not (FOLDER / name).exists() or (FOLDER / name).read_bytes() != (Path(tmp) / name).read_bytes()]
        if args.check:
            if stale:
                print(f"out of date: {', '.join(stale)}; run python scripts/generate_v2_grpc.py", file=sys.stderr)
            return 1 if stale else 0
        for name in OUTPUTS:
            os.replace(Path(tmp) / name, FOLDER / name)
    print(f"wrote {', '.join(OUTPUTS)} in {FOLDER.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

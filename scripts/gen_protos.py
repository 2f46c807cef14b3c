#!/usr/bin/env python
"""Regenerate the Python code for the contracts in protos/ into agentflow/proto/v1/.

    python scripts/gen_protos.py            # rewrite agentflow/proto/v1 in place
    python scripts/gen_protos.py --out DIR  # write somewhere else (the drift test does this)

Runs grpc_tools.protoc (messages, gRPC stubs and .pyi stubs), flattens protos/agentflow/v1/x.proto to
<out>/x_pb2.py, x_pb2.pyi and x_pb2_grpc.py, and rewrites the cross-file imports protoc emits
(`from agentflow.v1 import x_pb2`) to the package they live in (`from agentflow.proto.v1 import x_pb2`).
Output depends only on the .proto files and the grpcio-tools version, so it is committed and drift-tested.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
PROTO_PACKAGE_DIR = Path("agentflow") / "v1"  # where the .proto files sit under PROTO_ROOT
DEFAULT_OUT = REPO / "agentflow" / "proto" / "v1"
PYTHON_PACKAGE = "agentflow.proto.v1"

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# `from agentflow.v1 import x_pb2` and `import agentflow.v1.x_pb2` at the start of a line.
_IMPORT_RE = re.compile(r"^(\s*)(from|import) agentflow\.v1(?=[\s.])", re.MULTILINE)

INIT_TEXT = '''"""Generated protobuf and gRPC code for the agentflow.v1 contracts (protos/agentflow/v1).

Do not edit: regenerate with `python scripts/gen_protos.py`; tests/unit/test_protos.py checks for drift.
"""
'''


def _rewrite_imports(text: str) -> str:
    return _IMPORT_RE.sub(lambda m: f"{m.group(1)}{m.group(2)} {PYTHON_PACKAGE}", text)


def _run_protoc(protos: list[str], dest: Path) -> None:
    from importlib import resources

    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={dest}",
        f"--pyi_out={dest}",
        f"--grpc_python_out={dest}",
        *protos,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc} (command: {' '.join(args)})")


def generate(out: Path) -> list[Path]:
    """Generate into `out` (created if needed; stale generated files removed). Returns the files written."""
    proto_dir = PROTO_ROOT / PROTO_PACKAGE_DIR
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in proto_dir.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_dir}")

    with tempfile.TemporaryDirectory(prefix="gen_protos_") as tmp:
        tmp_path = Path(tmp)
        _run_protoc(protos, tmp_path)
        produced = sorted((tmp_path / PROTO_PACKAGE_DIR).iterdir())
        generated = {p.name: _rewrite_imports(p.read_text(encoding="utf-8")) for p in produced if p.is_file()}

    out.mkdir(parents=True, exist_ok=True)
    for old in sorted(out.iterdir()):
        if old.is_file() and old.name.endswith(GENERATED_SUFFIXES) and old.name not in generated:
            old.unlink()
    generated["__init__.py"] = INIT_TEXT

    written = []
    for name in sorted(generated):
        path = out / name
        data = generated[name].encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    for path in generate(args.out.resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CRI's Python messages and stubs, generated from ``cri.proto`` at run time.

Nothing generated is committed: ``grpc_tools.protoc`` writes ``cri_pb2`` and
``cri_pb2_grpc`` into a cache directory named by the proto's and the
generator's versions, once per machine (under a lock, written to a temporary
directory and renamed, so concurrent runs never see half a module).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).with_name("cri.proto")
CACHE = Path("/var/cache/pyvmm-cri-stubs")
CACHE_ENV = "PYVMM_CRI_STUBS"


class StubError(RuntimeError):
    """grpcio-tools is missing or protoc refused the proto."""


def _key() -> str:
    try:
        from grpc_tools import __version__ as tools  # type: ignore[attr-defined]
    except ImportError:
        from importlib.metadata import version

        tools = version("grpcio-tools")
    digest = hashlib.sha256(PROTO.read_bytes() + tools.encode()).hexdigest()
    return digest[:16]


def generate(cache: Path | None = None) -> Path:
    """The directory holding ``cri_pb2.py`` and ``cri_pb2_grpc.py``."""
    try:
        from grpc_tools import protoc
    except ImportError as err:
        raise StubError("grpcio-tools is not installed (scripts/setup installs it)") from err
    root = Path(cache or os.environ.get(CACHE_ENV) or CACHE)
    root.mkdir(parents=True, exist_ok=True)
    out = root / _key()
    if (out / "cri_pb2_grpc.py").exists():
        return out
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "cri_pb2_grpc.py").exists():
            return out
        work = Path(tempfile.mkdtemp(dir=root, prefix=".gen-"))
        try:
            include = Path(protoc.__file__).parent / "_proto"
            status = protoc.main(
                [
                    "protoc",
                    f"-I{PROTO.parent}",
                    f"-I{include}",
                    f"--python_out={work}",
                    f"--grpc_python_out={work}",
                    str(PROTO),
                ]
            )
            if status != 0:
                raise StubError(f"protoc failed on {PROTO} (status {status})")
            os.rename(work, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(work)
    return out


def load() -> tuple[ModuleType, ModuleType]:
    """``(cri_pb2, cri_pb2_grpc)``, generated first if need be."""
    where = str(generate())
    if where not in sys.path:
        sys.path.insert(0, where)  # cri_pb2_grpc imports cri_pb2 by its plain name
    return importlib.import_module("cri_pb2"), importlib.import_module("cri_pb2_grpc")

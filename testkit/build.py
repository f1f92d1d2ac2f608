"""cffi builder of testkit._kit, the test-only extension (not part of pyvmm).

It compiles testkit/csrc/*.c against the ring headers in csrc/ (include
path csrc/ first), so the ring operations the tests drive are exactly the
static inline code of csrc/shmstream_ring.h that guests and the IO thread
compile.  Build it with ``python3 -m testkit.build`` (scripts/setup does);
``testkit.native`` rebuilds it when a source is newer than the build.
Run as a module it also builds testkit._guestnet (guestnet_build.py).
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from pathlib import Path

from cffi import FFI

KIT = Path(__file__).resolve().parent
ROOT = KIT.parent
PRODUCT_C = ROOT / "csrc"
KIT_C = KIT / "csrc"
HEADERS = ("shm_testing.h", "traffic.h", "devkind.h")
SOURCES = ("shm_testing.c", "traffic.c", "devkind.c")
MODULE = "testkit._kit"


def inputs() -> list[Path]:
    """Every file the build reads: a newer one makes the build stale."""
    return sorted([*KIT_C.glob("*.[ch]"), *PRODUCT_C.glob("*.h"), Path(__file__)])


def built() -> Path | None:
    """The built extension in testkit/, if any."""
    found = sorted(KIT.glob("_kit.*.so"))
    return found[0] if found else None


def is_stale() -> bool:
    so = built()
    if so is None:
        return True
    mtime = so.stat().st_mtime
    return any(p.stat().st_mtime > mtime for p in inputs())


def cdef_of(header: Path) -> str:
    """The header without its preprocessor lines, except integer #defines."""
    lines = []
    for line in header.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#define"):
            continue
        if stripped.startswith("#define") and len(stripped.split()) != 3:
            continue  # include guards
        lines.append(line)
    return "\n".join(lines)


def build_ffi() -> FFI:
    ffi = FFI()
    for header in HEADERS:
        ffi.cdef(cdef_of(KIT_C / header))
    ffi.set_source(
        MODULE,
        "".join(f'#include "{h}"\n' for h in HEADERS),
        sources=[str(KIT_C / s) for s in SOURCES],
        include_dirs=[str(PRODUCT_C), str(KIT_C)],
        extra_compile_args=["-O2", "-Wall", "-std=gnu11"],
        libraries=["pthread"],
    )
    return ffi


def build(force: bool = False) -> Path:
    """Build testkit/_kit*.so unless it is up to date; its path.

    Serialised by a lock file, and the new library replaces the old one by
    rename, so a process that has the old one loaded keeps a whole file.
    """
    with open(KIT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and not is_stale():
            return built()  # type: ignore[return-value]
        with tempfile.TemporaryDirectory(prefix="testkit-build-") as tmp:
            made = Path(build_ffi().compile(tmpdir=tmp, verbose=False))
            target = KIT / made.name
            staged = KIT / f".{made.name}.new"
            staged.write_bytes(made.read_bytes())
            os.replace(staged, target)
        for old in KIT.glob("_kit.*.so"):
            if old != target:
                old.unlink()
        return target


if __name__ == "__main__":
    force = "--force" in sys.argv[1:]
    print(build(force=force))
    # The second test-only extension: the guest's net_shm.c for the host.
    from testkit import guestnet_build

    print(guestnet_build.build(force=force))

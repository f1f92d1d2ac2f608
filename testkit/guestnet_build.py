"""cffi builder of testkit._guestnet: the guest's shmstream driver,
guests/runtime/net_shm.c, compiled for the host so unit tests can run it
against a broken or hostile "host" (the test, writing the ring memory).

A second extension beside testkit._kit (build.py) rather than part of it:
it has other inputs (the guest runtime's headers, net_shm.c), and a
mutation run rebuilds it once per mutant of net_shm.c, which should not
recompile the rest of the kit.

net_shm.c is compiled unchanged: its text is copied into a directory of its
own, and the include path starts with testkit/guestrt/, whose hypercall.h
stands in for the guest's (the hypercall becomes a call into the harness).
Then come guests/runtime/ (rt.h, rt_internal.h, solo5.h) and csrc/ (the
ring and ABI headers, the same the guest and the host compile).  The test
doubles of the runtime are testkit/guestrt/doubles.c; the kick's outl is
trapped there, not edited out.

``python3 -m testkit.build`` builds it too (scripts/setup runs that);
``testkit.guestnet`` rebuilds it when its inputs changed (by content, so a
mutant and the restored file each get their own build).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from cffi import FFI

KIT = Path(__file__).resolve().parent
ROOT = KIT.parent
SHIM = KIT / "guestrt"
RUNTIME = ROOT / "guests" / "runtime"
PRODUCT_C = ROOT / "csrc"
DRIVER = RUNTIME / "net_shm.c"
ABI_HEADERS = ("hvt_abi.h", "pyvmm_abi.h", "shmstream.h")
MODULE = "testkit._guestnet"
STAMP = KIT / ".guestnet.inputs"

_DEFINE = re.compile(r"^#define\s+\w+\s+(0x[0-9a-fA-F]+|\d+)\s*$")
_STATS = re.compile(r"struct pyvmm_net_stats \{.*?\};", re.S)


class NoCompiler(RuntimeError):
    """testkit._guestnet must be built and there is no C compiler."""


def inputs() -> list[Path]:
    """Every file the build reads."""
    return sorted(
        {
            DRIVER,
            *SHIM.glob("*.[ch]"),
            *RUNTIME.glob("*.h"),
            *PRODUCT_C.glob("*.h"),
            Path(__file__),
        }
    )


def digest() -> str:
    h = hashlib.sha256()
    for path in inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def built() -> Path | None:
    """The built extension in testkit/, if any."""
    found = sorted(KIT.glob("_guestnet.*.so"))
    return found[0] if found else None


def is_stale() -> bool:
    if built() is None or not STAMP.exists():
        return True
    return STAMP.read_text().strip() != digest()


def cdef_of(header: Path) -> str:
    """The header without its preprocessor lines, except integer #defines."""
    keep = []
    for line in header.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not _DEFINE.match(stripped):
            continue
        keep.append(line)
    return "\n".join(keep)


def stats_cdef() -> str:
    """struct pyvmm_net_stats as rt.h has it, with `...;` so the compiler
    checks and completes the layout."""
    found = _STATS.search((RUNTIME / "rt.h").read_text())
    if found is None:
        raise RuntimeError("guests/runtime/rt.h: no struct pyvmm_net_stats")
    return found[0].replace("};", "...;\n};")


def build_ffi(driver_dir: Path) -> FFI:
    """The builder, with ``driver_dir`` holding the copy of net_shm.c."""
    ffi = FFI()
    for header in ABI_HEADERS:
        ffi.cdef(cdef_of(PRODUCT_C / header))
    ffi.cdef(stats_cdef())
    ffi.cdef(
        """
        typedef enum { SOLO5_R_OK, SOLO5_R_AGAIN, SOLO5_R_EINVAL, SOLO5_R_EUNSPEC, ... }
            solo5_result_t;
        #define SOLO5_NET_HLEN ...
        #define SHM_BAD ...
        """
    )
    ffi.cdef(cdef_of(SHIM / "guestnet.h"))
    ffi.set_source(
        MODULE,
        '#include "rt.h"\n#include "pyvmm_abi.h"\n#include "shmstream_ring.h"\n'
        '#include "guestnet.h"\n',
        sources=[str(SHIM / "doubles.c"), str(SHIM / "netshm_harness.c")],
        # The double of hypercall.h first, then the copy of net_shm.c.
        include_dirs=[str(SHIM), str(driver_dir), str(RUNTIME), str(PRODUCT_C)],
        extra_compile_args=["-O2", "-Wall", "-std=gnu11"],
    )
    return ffi


def compiler() -> str:
    cc = os.environ.get("CC", "gcc").split()[0]
    if shutil.which(cc) is None:
        raise NoCompiler(
            f"testkit._guestnet (guests/runtime/net_shm.c for the host) is not built "
            f"and there is no C compiler {cc!r}: install gcc (scripts/setup does) "
            "and run python3 -m testkit.build"
        )
    return cc


def build(force: bool = False) -> Path:
    """Build testkit/_guestnet*.so unless it is up to date; its path.

    Serialised by testkit's build lock; the new library replaces the old one
    by rename, so a process that has the old one loaded keeps a whole file.
    """
    with open(KIT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and not is_stale():
            return built()  # type: ignore[return-value]
        compiler()
        want = digest()
        with tempfile.TemporaryDirectory(prefix="testkit-guestnet-") as tmp:
            driver_dir = Path(tmp) / "driver"
            driver_dir.mkdir()
            shutil.copyfile(DRIVER, driver_dir / DRIVER.name)
            made = Path(build_ffi(driver_dir).compile(tmpdir=tmp, verbose=False))
            target = KIT / made.name
            staged = KIT / f".{made.name}.new"
            staged.write_bytes(made.read_bytes())
            os.replace(staged, target)
        for old in KIT.glob("_guestnet.*.so"):
            if old != target:
                old.unlink()
        STAMP.write_text(want + "\n")
        return target


if __name__ == "__main__":
    print(build(force="--force" in sys.argv[1:]))

"""The baseline process: pyvmm's network guests built as plain Linux programs.

bench/pps.py compares every pyvmm mode with the same receiving, sending or
echoing program run as one ordinary process on the tap (no VM, one thread,
one read or write per frame). The guest's source (guests/NAME.c) and its
protocol code (guests/runtime/netproto.c) are compiled unchanged, with the
guest's own code-generation flags, against bench/csrc/hostrt.c, which
implements the Solo5 calls on a tap file descriptor; so the process parses,
checksums and checks every frame with the very code the guest runs.

    path = build("udpsink")      # bench/build/udpsink-process, rebuilt when stale
    argv = [str(path), "tap100", MAC, *guest_args]
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "build"
SHIM = ROOT / "bench" / "csrc" / "hostrt.c"
RUNTIME = ROOT / "guests" / "runtime"
# The guest's code generation (guests/Makefile) for the code both run: no
# vector registers, no loops turned into library calls.
GUEST_FLAGS = ["-O2", "-mgeneral-regs-only", "-fno-tree-loop-distribute-patterns"]


def build(program: str) -> Path:
    """guests/PROGRAM.c as a process; rebuilt when any source is newer."""
    sources = [ROOT / "guests" / f"{program}.c", RUNTIME / "netproto.c", RUNTIME / "parse.c"]
    headers = [RUNTIME / "netproto.h", RUNTIME / "rt.h", RUNTIME / "solo5.h"]
    out = OUT / f"{program}-process"
    newest = max(p.stat().st_mtime for p in [*sources, *headers, SHIM])
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    OUT.mkdir(parents=True, exist_ok=True)
    include = [f"-I{RUNTIME}", f"-I{ROOT / 'csrc'}"]
    objs = []
    for src in sources:
        obj = OUT / f"{program}-{src.stem}.o"
        cmd = ["gcc", "-std=gnu11", "-Wall", "-c", *GUEST_FLAGS, *include, str(src), "-o", str(obj)]
        subprocess.run(cmd, check=True)
        objs.append(str(obj))
    shim = ["gcc", "-std=gnu11", "-O2", "-Wall", *include, str(SHIM), *objs, "-o", str(out)]
    subprocess.run(shim, check=True)
    return out

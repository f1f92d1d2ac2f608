"""The sandbox's filter compiled ahead of the run, by the build.

Compiling the filter with libseccomp costs a cold VM process 0.4 ms (a
cold ``pyvmm --restore`` spends 3-5 ms from the snapshot's opening to the
guest's first instruction). The same rules always compile to the same
program, so the build (setup.py) writes it next to the extension that
holds the rules' C half, and a process reads it instead (a few
microseconds).

A program file is used only when it was made from exactly these rules: its
header line holds the syscall names, the action and the extension file's
identity (device, inode, size, modification time), so a rebuilt
extension (a mutated csrc/sandbox.c, say) or a changed list makes it stale.
It is also ignored when another user than the extension's owner owns it or
others may write it: whoever may write it could otherwise loosen the
sandbox, and whoever may write the extension needs no file to do so.
Anything off and the filter is compiled as before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from pyvmm import _native

FORMAT = b"pyvmm-seccomp/1"
_SOCK_FILTER = 8  # bytes of one BPF instruction (struct sock_filter)


def path(kill: bool, directory: str | None = None) -> str:
    where = directory or os.path.dirname(_native.__file__)
    return os.path.join(where, f"_sandbox-{'kill' if kill else 'errno'}.bpf")


def key(names: tuple[str, ...], kill: bool) -> bytes:
    """What the program is a function of, as one line (compared whole: a
    hash would cost its module's import, 3 ms, on a cold start)."""
    lib = os.stat(_native.__file__)
    made_of = f"{'kill' if kill else 'errno'} {lib.st_dev}:{lib.st_ino}:{lib.st_size}:"
    return (made_of + f"{lib.st_mtime_ns} " + ",".join(names)).encode()


def load(names: tuple[str, ...], kill: bool, directory: str | None = None) -> bytes | None:
    """The program written for exactly these rules, or None."""
    try:
        fd = os.open(path(kill, directory), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        owner = os.stat(_native.__file__).st_uid
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != owner
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            return None
        data = os.read(fd, info.st_size)
    finally:
        os.close(fd)
    header = FORMAT + b" " + key(names, kill) + b"\n"
    program = data[len(header) :]
    if (
        not data.startswith(header)
        or not program
        or len(program) % _SOCK_FILTER
        or len(program) > _native.lib.PYVMM_SANDBOX_PROG_MAX
    ):
        return None
    return program


def write(
    names: tuple[str, ...], compile_program: Callable[[bool], bytes], directory: str | None = None
) -> list[str]:
    """``compile_program(kill)``'s programs (errno and kill) written for
    ``load``: the build's step (``python -m pyvmm.host.sandbox``). The files
    written."""
    written = []
    for kill in (False, True):
        target = path(kill, directory)
        program = compile_program(kill)
        temporary = f"{target}.{os.getpid()}.new"
        with open(temporary, "wb") as out:
            out.write(FORMAT + b" " + key(names, kill) + b"\n" + program)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
        written.append(target)
    return written

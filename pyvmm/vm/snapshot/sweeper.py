"""The helper that removes a snapshot directory the run never filled.

Run as ``python3 -I -S sweeper.py NAME`` by ``SnapshotTarget`` before the
sandbox goes on (which refuses unlink and rmdir to pyvmm itself), with
fd 3 the directory that holds NAME, fd 4 the read end of pyvmm's pipe and
fd 5 the write end of the reply. It waits for the end of the pipe (pyvmm
closing it, or exiting whatever the way); unless pyvmm wrote the byte ``K``
first (the snapshot is complete: keep it), it removes NAME's three files
and NAME; then it exits, which ends the reply pyvmm waits for. It imports
nothing of pyvmm's and removes nothing else.
"""

import os
import signal
import sys

PARENT_FD, COMMANDS, REPLY = 3, 4, 5
FILES = ("snapshot.json", "cpu.state", "memory")


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # pyvmm's own end ends this one
    name = sys.argv[1] if len(sys.argv) == 2 else ""
    if not name or "/" in name or name in (".", ".."):
        return 2
    os.closerange(REPLY + 1, 1 << 20)
    keep = False
    while True:
        try:
            got = os.read(COMMANDS, 64)
        except InterruptedError:
            continue
        if not got:
            break
        keep = keep or b"K" in got
    if keep:
        return 0
    try:
        dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=PARENT_FD)
    except OSError:
        return 1
    try:
        for file in FILES:
            try:
                os.unlink(file, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(dir_fd)
    try:
        os.rmdir(name, dir_fd=PARENT_FD)
    except OSError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

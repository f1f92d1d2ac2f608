"""The helper that names a sandboxed run's core file (core.py says why).

Run as ``python3 -I -S corelink.py NAME`` by ``CoreDir`` before the
sandbox goes on, with fd 3 the --dumpcore directory, fd 4 the unnamed core
file, fd 5 the read end of pyvmm's pipe and fd 6 the write end of the
reply. It does one thing: on the byte ``L`` it links fd 4 into fd 3 as
NAME (never replacing a file) and answers ``ok`` or the error; at the end
of the pipe (pyvmm exited, whatever the way) it exits, and the unnamed
file goes with the last fd. It imports nothing of pyvmm's and reads
nothing from pyvmm but that one byte.
"""

import os
import signal
import sys

DIR_FD, FILE_FD, COMMANDS, REPLIES = 3, 4, 5, 6


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # pyvmm's own end ends this one
    name = sys.argv[1] if len(sys.argv) == 2 else ""
    if not name or "/" in name:
        return 2
    os.closerange(REPLIES + 1, 1 << 20)
    while True:
        try:
            command = os.read(COMMANDS, 1)
        except InterruptedError:
            continue
        if command != b"L":
            return 0
        try:
            os.link(f"/proc/self/fd/{FILE_FD}", name, dst_dir_fd=DIR_FD)
            reply = b"ok"
        except OSError as err:
            reply = (err.strerror or "link failed").encode()
        os.write(REPLIES, reply)
        return 0


if __name__ == "__main__":
    sys.exit(main())

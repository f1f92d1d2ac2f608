"""Who is at the other end of the API socket (SO_PEERCRED), for both ends.

The launcher runs guests as its user (root, usually) and ``pyvmm run``
hands it its stdout and stderr. So each end checks the other's user,
which the kernel records on the socket (the listener's at listen(2), the
client's at connect(2)) and nobody can forge: the client talks only to a
launcher of root or of its own user, the launcher only to root, its own
user and the users it was told to allow (``pyvmm serve --allow-uid``).
A file mode alone would not do: a socket in a directory others can
write can be replaced, and a mode can be widened by mistake.
"""

from __future__ import annotations

import os
import socket
import struct

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The user of the process at the other end of a connected socket."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(data)[1]


def peer_pid(sock: socket.socket) -> int:
    """The process at the other end, as it was at connect(2) (a process
    that connected itself: pyvmm-oci's relay, which the launcher moves
    into its container's cgroup)."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(data)[0]


def trusted(uid: int, allowed: frozenset[int] = frozenset()) -> bool:
    """Root, this process's own user, or one of ``allowed``."""
    return uid == 0 or uid == os.geteuid() or uid in allowed

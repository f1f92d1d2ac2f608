"""The unikernel a snapshot was taken of, and how a restore knows it has it.

A snapshot records two things about its unikernel:

- ``sha256``: a SHA-256 of what was loaded from the file (entry, every
  segment, every note), so that a copy of the file elsewhere is the same
  kernel and an edited one is not;
- ``file``: the file's device, inode, size and modification and change
  times as they were when it was read.

A restore whose kernel file still has the recorded ``file`` identity is
reading the very file the snapshot's kernel was read from, unchanged
since (any write moves its change time, which no user can set back), so
its loaded bytes are the same and the hash is not made again: hashing
costs about 6 ms per MiB of loaded bytes on this host (CPython's
built-in SHA-256), most of a cold restore of a 4 MiB unikernel. Any
difference (a copy, another machine, a rewritten file, a snapshot from
before the field existed) falls back to the hash. The identity is a
consistency check, not a secret: a forged snapshot could name any hash.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

from pyvmm.vm.snapshot.format import sha256

if TYPE_CHECKING:
    from pyvmm.loader import Kernel

#: The keys of a recorded ``file`` identity, in FileIdentity's order.
FILE_KEYS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")

#: id(kernel) -> (the kernel, weakly; its hash): hashed once per loaded
#: kernel, which a launcher keeps and its VMs inherit.
_HASHES: dict[int, tuple[weakref.ref, str]] = {}


def loaded_sha256(kernel: Kernel) -> str:
    """The SHA-256 of what was loaded from the kernel's file, made once per
    loaded kernel (kept by the kernel object's id, checked against a weak
    reference)."""
    known = _HASHES.get(id(kernel))
    if known is not None and known[0]() is kernel:
        return known[1]
    digest = sha256()
    digest.update(kernel.entry.to_bytes(8, "little"))
    for seg in kernel.segments:
        digest.update(b"%d:%d:%d:" % (seg.paddr, seg.end, len(seg.data)))
        digest.update(seg.data)
    for note in kernel.image.notes:
        digest.update(repr(note).encode())
    value = digest.hexdigest()
    for key in [k for k, (ref, _) in _HASHES.items() if ref() is None]:
        del _HASHES[key]
    _HASHES[id(kernel)] = (weakref.ref(kernel), value)
    return value


def file_identity(kernel: Kernel) -> dict[str, int] | None:
    """The file's identity as it was read, or None where the loader could
    not vouch for it (the file changed while it was read)."""
    file = kernel.file
    if file is None:
        return None
    return {key: getattr(file, key) for key in FILE_KEYS}


def kernel_identity(kernel: Kernel) -> dict[str, Any]:
    """What a snapshot records of its unikernel (the module's docstring)."""
    identity: dict[str, Any] = {
        "path": os.path.abspath(kernel.path),
        "size": kernel.file.size if kernel.file is not None else None,
        "sha256": loaded_sha256(kernel),
    }
    file = file_identity(kernel)
    if file is not None:
        identity["file"] = file
    return identity


def same_kernel(kernel: Kernel, sha256_hex: str, file: dict[str, int] | None) -> bool:
    """Whether ``kernel`` is the one recorded: the same unchanged file
    (no hash made), or else the same loaded bytes."""
    if file is not None and file_identity(kernel) == file:
        return True
    return loaded_sha256(kernel) == sha256_hex

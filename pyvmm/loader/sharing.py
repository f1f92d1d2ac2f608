"""Image pages shared between guests of the same unikernel file.

Instead of copying a segment into anonymous memory, the loader maps the
file's whole pages privately (``MAP_PRIVATE | MAP_FIXED``) over the right
part of guest memory: N guests of one image then hold one copy of its
text and read-only data, the page cache's.

Three rules, each written once here:

- which bytes can be mapped (``file_runs``): for each read-only segment,
  the whole pages of its file bytes [p_paddr, p_paddr + p_filesz), when
  p_offset and p_paddr are congruent modulo the page size (else a file
  page does not land on a guest page, and the segment is copied). The
  partial pages at either end (a page shared with a neighbouring segment,
  the last file page whose tail is the zero-filled .bss start) are copied,
  so they hold exactly what copying would give. Writable segments are
  copied: a page the guest wrote is still the file's to take away (a
  truncation discards private copies too), and it could not be copied out
  while the guest and the IO thread may write it;
- which files can be mapped (``refusal``): a page not yet copied is the
  page cache's, so a later write to the file reaches the guest, and a
  truncation takes it away. Only a file that nobody but root and the user
  pyvmm runs as can write (they can change the guest's memory through
  /proc/PID/mem or ptrace anyway), on a local file system (where every
  writer opens the file here), is mapped;
- and only under a read lease (``lease.ImageLease``): nobody has the file
  open for writing when it is taken, and whoever opens it for writing or
  truncates it later waits until this process has copied what it mapped.
  That is what makes the rule hold while the guest runs: someone who kept
  a descriptor open for writing from before the file became root's
  cannot take the lease's place. Anything else is copied
  (docs/security.md).
"""

import os
import stat
from collections.abc import Iterable

from pyvmm._native import lib
from pyvmm.common.log import log
from pyvmm.common.record import Record
from pyvmm.common.sizes import PAGE_SIZE
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader.elf import Segment
from pyvmm.loader.lease import COPIED, HELD, LOST, ImageLease

# PYVMM_IMAGE_SHARING=0 copies every image (a network file system whose
# other clients may write the file, or a before/after measurement).
ENV_SWITCH = "PYVMM_IMAGE_SHARING"
_ACL_XATTR = "system.posix_acl_access"

# File systems (statfs f_type) whose files change only through opens on
# this host, which a lease sees. Not here: network file systems (another
# client's write breaks no lease here), FUSE (its server can answer
# anything at any time), and any file system this list does not know.
LOCAL_FILE_SYSTEMS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0xCA451A4E: "bcachefs",
    0x794C7630: "overlayfs",
    0x73717368: "squashfs",
    0xE0F5E1E2: "erofs",
    0x9660: "iso9660",
    0x4D44: "vfat",
    0x2011BAB0: "exfat",
    0x3153464A: "jfs",
    0x52654973: "reiserfs",
}


class FileIdentity(Record):
    """What says a file is still the one that was read and checked."""

    __slots__ = ("dev", "ino", "size", "mtime_ns", "ctime_ns")

    def __init__(self, dev: int, ino: int, size: int, mtime_ns: int, ctime_ns: int) -> None:
        self.dev = dev
        self.ino = ino
        self.size = size
        self.mtime_ns = mtime_ns
        self.ctime_ns = ctime_ns

    @classmethod
    def of(cls, st: os.stat_result) -> "FileIdentity":
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileRun(Record):
    """Whole pages of the file at ``offset`` that become guest pages at ``gpa``."""

    __slots__ = ("gpa", "offset", "length")

    def __init__(self, gpa: int, offset: int, length: int) -> None:
        self.gpa = gpa
        self.offset = offset
        self.length = length


def file_runs(segments: Iterable[Segment]) -> tuple[FileRun, ...]:
    """The whole file pages each segment can map, at most one run per segment.

    Segments do not overlap in guest memory (parse_elf), so a page wholly
    inside one segment's file bytes holds nothing of another's; a page two
    segments share is partial for both and never mapped.
    """
    runs = []
    for seg in segments:
        if seg.writable:
            continue  # copied: see the module's docstring
        if (seg.offset - seg.paddr) % PAGE_SIZE:
            continue  # file pages and guest pages do not line up: copied
        start = -(-seg.paddr // PAGE_SIZE) * PAGE_SIZE
        end = (seg.paddr + seg.filesz) // PAGE_SIZE * PAGE_SIZE
        if end > start:
            runs.append(FileRun(start, seg.offset + (start - seg.paddr), end - start))
    return tuple(runs)


def refusal(st: os.stat_result, fd: int, *, euid: int, noexec: bool) -> str | None:
    """Why the file open as ``fd`` must be copied rather than mapped, or None."""
    if os.environ.get(ENV_SWITCH) == "0":
        return f"{ENV_SWITCH}=0"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in (0, euid):
        return f"owned by uid {st.st_uid}, who could rewrite it under the guest"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by group or others, who could rewrite it under the guest"
    try:
        os.getxattr(fd, _ACL_XATTR)
        return "an access ACL may let others rewrite it under the guest"
    except OSError:
        pass  # no ACL (ENODATA) or none possible (EOPNOTSUPP)
    if noexec:
        # Text mapped from a noexec mount cannot be made executable on the host.
        return "on a noexec mount"
    magic = lib.pyvmm_fs_magic(fd)
    if magic not in LOCAL_FILE_SYSTEMS:
        return (
            f"on a file system (type {magic:#x}) where others may change it unseen "
            f"(network, FUSE or unknown)"
        )
    return None


def map_image(
    path: str,
    identity: FileIdentity | None,
    segments: tuple[Segment, ...],
    memory: GuestMemory,
    lease: ImageLease | None = None,
) -> tuple[FileRun, ...]:
    """Map what ``file_runs`` allows of ``path`` over guest memory; the runs
    mapped (none, with the reason logged, when the file must be copied).

    ``lease`` is the one the loader took to read the file; without one
    of this process (a launcher's child, a file read into memory), one is
    taken here. Either way it lives as long as ``memory``, which says at
    the end whether a writer came and what it cost.
    """
    runs = file_runs(segments)
    if not runs or identity is None:
        return ()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        log.info("image %s copied: cannot reopen it (%s)", path, e.strerror)
        return ()
    try:
        st = os.fstat(fd)
        if FileIdentity.of(st) != identity:
            why: str | None = "it changed since it was read"
        else:
            noexec = bool(os.fstatvfs(fd).f_flag & os.ST_NOEXEC) and any(
                seg.executable for seg in segments
            )
            why = refusal(st, fd, euid=os.geteuid(), noexec=noexec)
        if why is None and (lease is None or not lease.ours):
            taken = ImageLease.take(path, fd)
            why, lease = (taken, None) if isinstance(taken, str) else (None, taken)
        if why is None and lease is not None and lease.state != HELD:
            why = "opened for writing while pyvmm read it"
        if why is not None or lease is None:
            log.info("image %s copied, not shared: %s", path, why)
            return ()
        mapped = []
        for run in runs:
            err = memory.map_file(run.gpa, run.length, fd, run.offset, lease=lease.slot)
            if err == lib.PYVMM_LEASE_BROKEN:
                log.info("image %s: the rest copied: opened for writing meanwhile", path)
                break
            if err:
                log.info("image %s: pages at %#x copied: mmap: %s", path, run.gpa, os.strerror(err))
            else:
                mapped.append(run)
        memory.on_close(lambda: _report(lease, sum(r.length for r in mapped)))
        log.info(
            "image %s: %d KiB shared from the page cache (copy-on-write, under a read lease)",
            path,
            sum(r.length for r in mapped) // 1024,
        )
        return tuple(mapped)
    finally:
        os.close(fd)


def _report(lease: ImageLease, shared: int) -> None:
    """At the end of the guest's memory: whether a writer came meanwhile."""
    state = lease.state
    if state == COPIED:
        log.info(
            "image %s: opened for writing while the guest ran: its %d KiB of shared "
            "pages were copied first, then the writer went on",
            lease.path,
            shared // 1024,
        )
    elif state == LOST:
        log.info(
            "image %s: opened for writing while the guest ran, and some of its "
            "shared pages were already gone",
            lease.path,
        )

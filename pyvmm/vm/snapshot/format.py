"""The snapshot directory: what is in it, how it is written, how it is checked.

    DIR/                 mode 0700, made new (never an existing one)
      snapshot.json      the metadata, mode 0600, written last
      cpu.state          the vCPU's state, each part as KVM's struct
      memory             guest memory: a sparse file of exactly mem_size
                         bytes, holes where the guest's pages are zero

``snapshot.json`` carries a version, the checksum of the rest of itself
and of ``cpu.state`` (SHA-256), and the size of ``memory``; the memory is
not checksummed, so that a restore can map it and let pages load on
demand (its size and owner are checked). A snapshot is untrusted input:
``load`` checks every field and raises ``SnapshotError`` (one line).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import Any

from pyvmm.common.errors import PyvmmError
from pyvmm.common.sizes import GUEST_MEMORY_LIMIT, MEM_GRANULE, PAGE_SIZE

try:  # the built-in module: hashlib's import (OpenSSL) costs a restore ~3 ms
    from _sha256 import sha256
except ImportError:  # Python 3.12+ names it _sha2; hashlib has it everywhere
    from hashlib import sha256

FORMAT = "pyvmm-snapshot"
VERSION = 1
METADATA = "snapshot.json"
CPU_STATE = "cpu.state"
MEMORY = "memory"
#: Far more than any real metadata: a bigger file is refused unread.
METADATA_LIMIT = 1 << 20
CPU_STATE_LIMIT = 1 << 16
_PART = struct.Struct("<16sI")


class SnapshotError(PyvmmError):
    """A snapshot that cannot be written, or one that is refused."""


def checksum(data: bytes) -> str:
    return sha256(data).hexdigest()


def canonical(document: dict[str, Any]) -> bytes:
    """The bytes the metadata checksum covers (sorted keys, no spaces)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def seal(document: dict[str, Any]) -> bytes:
    """The metadata as written: the document plus the checksum of it."""
    body = {k: v for k, v in document.items() if k != "checksum"}
    return json.dumps({**body, "checksum": checksum(canonical(body))}, indent=1).encode() + b"\n"


def pack_state(parts: dict[str, bytes]) -> bytes:
    """``cpu.state``: each part as (name, length, bytes)."""
    return b"".join(
        _PART.pack(name.encode(), len(raw)) + raw for name, raw in sorted(parts.items())
    )


def unpack_state(raw: bytes, sizes: dict[str, int | tuple[int, int]]) -> dict[str, bytes]:
    """``cpu.state``'s parts, every name known and every size KVM's: an
    exact size, or (multiple, limit) for a list (the MSRs: (16, 4096))."""
    parts: dict[str, bytes] = {}
    at = 0
    while at < len(raw):
        if len(raw) - at < _PART.size:
            raise SnapshotError("cpu.state is truncated")
        name_raw, length = _PART.unpack_from(raw, at)
        at += _PART.size
        name = name_raw.rstrip(b"\0").decode("ascii", "replace")
        if name not in sizes or name in parts:
            raise SnapshotError(f"cpu.state has an unknown or repeated part '{name}'")
        want = sizes[name]
        multiple, limit = want if isinstance(want, tuple) else (0, 0)
        if length % multiple or length > limit if multiple else length != want:
            raise SnapshotError(f"cpu.state: part '{name}' is {length} bytes, not {want}")
        if len(raw) - at < length:
            raise SnapshotError("cpu.state is truncated")
        parts[name] = raw[at : at + length]
        at += length
    return parts


def make_directory(path: str) -> int:
    """A new, owner-only snapshot directory; its fd (O_DIRECTORY)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise SnapshotError(
            f"--snapshot-dir: {path} exists (a snapshot never replaces one)"
        ) from None
    except OSError as err:
        raise SnapshotError(f"--snapshot-dir: cannot create {path}: {err.strerror}") from None
    os.chmod(path, 0o700)  # whatever the umask
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def create_file(dir_fd: int, name: str) -> int:
    """A new owner-only file in the snapshot directory (never an existing one)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    os.fchmod(fd, 0o600)
    return fd


def write_all(fd: int, data: bytes, offset: int = 0) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def write_memory(fd: int, host) -> int:
    """Guest memory (``host``: a cffi buffer over it, whose slices are
    copies compared with memcmp) into the pre-sized, all-hole file ``fd``:
    only the pages that are not zero, so the file is sparse; returns how
    many were written."""
    zero_chunk = bytes(1 << 20)
    zero_page = zero_chunk[:PAGE_SIZE]
    written = 0
    for chunk_start in range(0, len(host), len(zero_chunk)):
        chunk = host[chunk_start : chunk_start + len(zero_chunk)]
        if chunk == zero_chunk[: len(chunk)]:
            continue
        for page in range(0, len(chunk), PAGE_SIZE):
            data = chunk[page : page + PAGE_SIZE]
            if data != zero_page:
                write_all(fd, data, chunk_start + page)
                written += 1
    return written


# -- reading ---------------------------------------------------------------------


def _read_limited(dir_fd: int, name: str, limit: int, what: str) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SnapshotError(f"{what}: no {name} (an incomplete snapshot?)") from None
    except OSError as err:
        raise SnapshotError(f"{what}: cannot open {name}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise SnapshotError(f"{what}: {name} is not a regular file of at most {limit} bytes")
        return os.pread(fd, limit + 1, 0)
    finally:
        os.close(fd)


def open_directory(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise SnapshotError(f"--restore: cannot open {path}: {err.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise SnapshotError(
            f"--restore: {path} is not owner-only or not this user's (a snapshot is private)"
        )
    return fd


def read_metadata(dir_fd: int, path: str) -> dict[str, Any]:
    """``snapshot.json``, its format, version and checksum checked."""
    raw = _read_limited(dir_fd, METADATA, METADATA_LIMIT, f"--restore: {path}")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SnapshotError(f"--restore: {path}: {METADATA} is not JSON (corrupted?)") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise SnapshotError(f"--restore: {path} is not a pyvmm snapshot")
    if document.get("version") != VERSION:
        raise SnapshotError(
            f"--restore: {path}: snapshot format version {document.get('version')!r}, "
            f"this pyvmm reads version {VERSION}"
        )
    body = {k: v for k, v in document.items() if k != "checksum"}
    if document.get("checksum") != checksum(canonical(body)):
        raise SnapshotError(f"--restore: {path}: {METADATA} fails its checksum (corrupted)")
    return body


def read_state(dir_fd: int, path: str, meta: Field, sizes: dict[str, int]) -> dict[str, bytes]:
    raw = _read_limited(dir_fd, CPU_STATE, CPU_STATE_LIMIT, f"--restore: {path}")
    if checksum(raw) != meta.text("sha256"):
        raise SnapshotError(f"--restore: {path}: {CPU_STATE} fails its checksum (corrupted)")
    return unpack_state(raw, sizes)


def open_memory(dir_fd: int, path: str, size: int) -> int:
    """The memory file, read-only: a regular file of exactly ``size`` bytes."""
    try:
        fd = os.open(MEMORY, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as err:
        raise SnapshotError(f"--restore: {path}: cannot open {MEMORY}: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        os.close(fd)
        raise SnapshotError(
            f"--restore: {path}: {MEMORY} is {info.st_size} bytes, the snapshot says {size} "
            "(truncated?)"
        )
    return fd


class Field:
    """Typed access to one object of the metadata: a missing or mistyped
    field is a SnapshotError naming it, never a KeyError."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise SnapshotError(f"--restore: snapshot field '{where}' is not an object")
        self.value = value
        self.where = where

    def _get(self, name: str, types: tuple[type, ...]) -> Any:
        value = self.value.get(name)
        if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
            raise SnapshotError(
                f"--restore: snapshot field '{self.where}.{name}' is missing or bad"
            )
        return value

    def integer(self, name: str, low: int = 0, high: int = (1 << 64) - 1) -> int:
        value = self._get(name, (int,))
        if not low <= value <= high:
            raise SnapshotError(f"--restore: snapshot field '{self.where}.{name}' is out of range")
        return value

    def maybe_integer(self, name: str) -> int | None:
        return None if self.value.get(name) is None else self.integer(name)

    def text(self, name: str) -> str:
        return self._get(name, (str,))

    def maybe_text(self, name: str) -> str | None:
        return None if self.value.get(name) is None else self.text(name)

    def flag(self, name: str) -> bool:
        return self._get(name, (bool,))

    def strings(self, name: str) -> list[str]:
        value = self._get(name, (list,))
        if not all(isinstance(v, str) for v in value):
            raise SnapshotError(f"--restore: snapshot field '{self.where}.{name}' is bad")
        return value

    def objects(self, name: str) -> list[Field]:
        return [Field(v, f"{self.where}.{name}") for v in self._get(name, (list,))]

    def object(self, name: str) -> Field:
        return Field(self.value.get(name), f"{self.where}.{name}")


def memory_size_ok(size: int) -> bool:
    return 0 < size <= GUEST_MEMORY_LIMIT and size % MEM_GRANULE == 0

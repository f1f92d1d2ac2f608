"""A snapshot of a launcher's VM, on request (``POST /vms/ID/snapshot``).

The VM's process runs under its sandbox, which refuses every open: it
cannot make a directory the request names only now. So the work is split
at the sandbox's line:

- the launcher (``Taking``) checks the path, makes the new owner-only
  directory and its three files, asks the VM's process for its state,
  then writes them: guest memory read from the VM's process through
  /proc/PID/mem (its parent may; only pages that are not zero), the vCPU
  state and the metadata it was sent, the checksums its own;
- the VM's process (``Snapshotter``) stops its vCPU between two exits,
  with the kick ``--snapshot-at=sigusr2`` uses (immediate_exit and a
  signal to the vCPU's thread), pauses its IO threads, captures the vCPU,
  sends it with the metadata only it knows (plan, devices and their host
  side, trap emulator, clock) and waits, the guest stopped, until the
  launcher says the files are written; then the guest runs on, or the run
  ends with status 0 (``"stop": true``).

The channel's messages (child.py's channel):

    launcher -> child  b"S" + {"dir": PATH, "stop": BOOL}   take one now
                       b"S+" / b"S-"                        written / given up
    child -> launcher  {"event": "snapshot", "state", "metadata", "memory_addr"}
                       {"event": "snapshot", "error": LINE}

What the VM's process sends is untrusted (events.py checks its shape); a
restore checks every field of the result again (vm/snapshot/restore.py).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from pyvmm._native import lib
from pyvmm.common.errors import PyvmmError
from pyvmm.common.sizes import PAGE_SIZE
from pyvmm.kvm import Interrupted
from pyvmm.serve.http import HttpError
from pyvmm.vm.snapshot import vcpu as cpu_state
from pyvmm.vm.snapshot.format import (
    CPU_STATE,
    CPU_STATE_LIMIT,
    MEMORY,
    METADATA,
    SnapshotError,
    checksum,
    create_file,
    make_directory,
    memory_size_ok,
    pack_state,
    seal,
    write_all,
)
from pyvmm.vm.snapshot.writer import KICK, check_snapshottable, metadata

if TYPE_CHECKING:
    from pyvmm.vm.vmm import Vmm

#: The request's keys.
KNOWN_KEYS = {"dir", "stop"}
#: How often the kick is repeated until the vCPU stops (s): a signal that
#: lands just before the fast path's poll begins would wait out its timeout.
KICK_EVERY = 0.01
#: How long the VM's process gets to stop its vCPU and send its state (s).
ANSWER_TIMEOUT = 10.0
#: How long a stopped guest waits for the launcher's files (s).
WRITE_TIMEOUT = 600.0


# -- in the VM's process -------------------------------------------------------


class SnapshotStop(PyvmmError):
    """``"stop": true``: the run ends once its snapshot is written, with
    status 0 (one line says so)."""

    def __init__(self, path: str) -> None:
        super().__init__(f'snapshot written to {path}; the run ends there ("stop": true)')
        self.exit_status = 0


class Snapshotter:
    """The VM's process's half: its vCPU stopped between two exits on the
    launcher's request, its state sent, the guest held until the answer."""

    def __init__(self, vmm: Vmm, channel: int) -> None:
        self.vmm = vmm
        self.channel = channel
        self.lock = threading.Lock()
        #: The request being served ({"dir", "stop"}), until it is done.
        self.request: dict[str, Any] | None = None
        self.taking = False
        self.vcpu_thread = 0
        self._answered = threading.Event()
        self._written = False
        signal.signal(KICK, _ignore)

    # The channel's thread: ---------------------------------------------------
    def asked(self, packet: bytes) -> None:
        """b"S{...}", b"S+" or b"S-" from the launcher."""
        if packet in (b"S+", b"S-"):
            with self.lock:
                if self.taking:
                    self._written = packet == b"S+"
                    self._answered.set()
                else:  # given up before the vCPU stopped
                    self.request = None
                    self.vmm.vcpu.set_immediate_exit(False)
            return
        refusal = self._refusal()
        if refusal is not None:
            self._send({"event": "snapshot", "error": refusal})
            return
        try:
            request = json.loads(packet[1:])
        except ValueError:
            return  # the launcher sends JSON: not reached
        with self.lock:
            self.request = {"dir": str(request.get("dir")), "stop": bool(request.get("stop"))}
        self.kick()

    def _refusal(self) -> str | None:
        vmm = self.vmm
        if self.request is not None:
            return "a snapshot of this VM is being taken already"
        if vmm.config.snapshot_at is not None:
            return "this VM takes its own snapshot (--snapshot-at)"
        if self.vcpu_thread == 0:
            return "the guest has not started yet"
        try:
            check_snapshottable(vmm.config, vmm.plan)
        except PyvmmError as err:
            return str(err).replace("--snapshot-at: ", "", 1)
        return None

    def kick(self) -> None:
        """Stop the vCPU at its next exit (repeated by the channel's thread
        every KICK_EVERY while ``pending``)."""
        with self.lock:
            if self.request is None or self.taking:
                return
            self.vmm.vcpu.set_immediate_exit(True)
        signal.pthread_kill(self.vcpu_thread, KICK)

    @property
    def pending(self) -> bool:
        return self.request is not None and not self.taking

    # The vCPU's thread: ------------------------------------------------------
    def wrap_run(self, run):
        """vcpu.run that takes the snapshot at the exit the kick causes."""
        self.vcpu_thread = threading.get_ident()

        def run_and_take(fast_path):
            exit = run(fast_path)
            if type(exit) is Interrupted and self.request is not None:
                if not lib.pyvmm_stop_signal():
                    self._take()
            return exit

        return run_and_take

    def _take(self) -> None:
        with self.lock:
            request = self.request
            if request is None or self.taking:
                return
            self.taking = True
            self._answered.clear()
            self.vmm.vcpu.set_immediate_exit(False)
        written = False
        # The IO threads paused too, so that guest memory, which the
        # launcher reads after, and the kinds' host side sent now agree.
        services = [service for _, service in self.vmm.services]
        for service in services:
            service.pause()
        try:
            written = self._send_state(request["dir"])
        finally:
            with self.lock:
                self.request, self.taking = None, False
            if not (written and request["stop"]):  # a run that ends, ends paused
                for service in services:
                    service.resume()
        if written and request["stop"]:
            raise SnapshotStop(request["dir"])

    def _send_state(self, path: str) -> bool:
        """The state to the launcher; whether it says it wrote the files."""
        vmm = self.vmm
        try:
            state = cpu_state.capture(vmm.vcpu)
            packed = pack_state(state)
            document = metadata(vmm, state, packed, time.time_ns(), 0)
        except PyvmmError as err:
            self._send({"event": "snapshot", "error": str(err)})
            return False
        self._send(
            {
                "event": "snapshot",
                "state": base64.b64encode(packed).decode(),
                "metadata": document,
                "memory_addr": vmm.memory.host_addr,
            }
        )
        deadline = time.monotonic() + WRITE_TIMEOUT
        while not self._answered.wait(0.05):  # a stop signal ends the wait
            if lib.pyvmm_stop_signal() or time.monotonic() > deadline:
                return False
        return self._written

    def _send(self, message: dict[str, Any]) -> None:
        try:
            os.write(self.channel, json.dumps(message).encode())
        except OSError:
            pass  # the launcher is gone: PR_SET_PDEATHSIG ends this run


def _ignore(signum: int, frame: object) -> None:
    """KICK's handler: its only work is interrupting KVM_RUN."""


# -- in the launcher -----------------------------------------------------------


def checked_request(body: dict[str, Any], max_path: int) -> tuple[str, bool]:
    """(directory, stop) of a snapshot request, or HttpError 400."""
    unknown = sorted(set(body) - KNOWN_KEYS)
    if unknown:
        raise HttpError(400, f"unknown key {unknown[0]!r} (known: dir, stop)")
    path = body.get("dir")
    if not isinstance(path, str) or not path or "\0" in path:
        raise HttpError(400, '"dir" must be a non-empty string (the new directory)')
    if len(path.encode("utf-8", "surrogateescape")) > max_path:
        raise HttpError(400, f'"dir" is longer than {max_path} bytes (PATH_MAX)')
    if not os.path.isabs(path):
        raise HttpError(400, f'"dir": {path[:200]} is not an absolute path')
    stop = body.get("stop", False)
    if not isinstance(stop, bool):
        raise HttpError(400, '"stop" must be true or false')
    return os.path.normpath(path), stop


class Taking:
    """The launcher's half of one snapshot: the directory made new before
    the VM is asked, filled when it answers, removed if it never does."""

    def __init__(self, path: str, stop: bool, pid: int) -> None:
        self.path = path
        self.stop = stop
        self.pid = pid
        self.started = time.monotonic()
        self.fds: dict[str, int] = {}
        try:
            self.dir_fd = make_directory(path)
        except SnapshotError as err:
            line = str(err).replace("--snapshot-dir: ", "dir: ")
            raise HttpError(400, f"pyvmm: {line}") from None
        try:
            for name in (METADATA, CPU_STATE, MEMORY):
                self.fds[name] = create_file(self.dir_fd, name)
        except OSError as err:
            self.remove()
            why = f"cannot create files in {path}: {err.strerror}"
            raise HttpError(400, f"pyvmm: dir: {why}") from None

    def request(self) -> bytes:
        return b"S" + json.dumps({"dir": self.path, "stop": self.stop}).encode()

    def write(self, event: dict[str, Any]) -> dict[str, Any]:
        """The VM's answer into the files; what the API answers. On any
        failure the directory is removed and SnapshotError says why."""
        try:
            return self._write(event)
        except SnapshotError:
            self.remove()
            raise
        except OSError as err:
            self.remove()
            raise SnapshotError(f"cannot write {self.path}: {err.strerror}") from None

    def _write(self, event: dict[str, Any]) -> dict[str, Any]:
        document = event["metadata"]
        plan = document.get("plan")
        mem_size = plan.get("mem_size") if isinstance(plan, dict) else None
        if type(mem_size) is not int or not memory_size_ok(mem_size):
            raise SnapshotError("the VM's process gave no valid memory size")
        packed = event["state"]
        os.ftruncate(self.fds[MEMORY], mem_size)  # all holes until written
        with _ProcessMemory(self.pid, event["memory_addr"], mem_size) as memory:
            pages = write_guest_memory(self.fds[MEMORY], memory)
        write_all(self.fds[CPU_STATE], packed)
        # The launcher's own counts and checksums, whatever the process said.
        document["cpu_state"] = {"file": CPU_STATE, "sha256": checksum(packed), "size": len(packed)}
        document["memory"] = {"file": MEMORY, "size": mem_size, "pages": pages}
        for name in (MEMORY, CPU_STATE):
            os.fsync(self.fds[name])
        write_all(self.fds[METADATA], seal(document))
        os.fsync(self.fds[METADATA])
        self.close()
        return {
            "dir": self.path,
            "pages": pages,
            "memory_bytes": mem_size,
            "stop": self.stop,
            "ms": round((time.monotonic() - self.started) * 1e3, 2),
        }

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    def remove(self) -> None:
        """An incomplete snapshot goes: its files, then the directory."""
        if self.dir_fd < 0:
            return
        for name in (METADATA, CPU_STATE, MEMORY):
            try:
                os.unlink(name, dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
        self.close()
        try:
            os.rmdir(self.path)
        except OSError:
            pass


#: pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
_PRESENT, _SWAPPED = 1 << 63, 1 << 62
#: The most read from the VM's process at once.
_CHUNK = 1 << 20


class _ProcessMemory:
    """A VM process's guest memory, read through /proc/PID/mem (the
    launcher is the process's parent).

    Only what can hold data is read: an anonymous page the process never
    touched is neither present nor swapped in /proc/PID/pagemap and reads
    as zero, so it is skipped unread (a 512 MiB guest has a few hundred
    KiB of such pages in use); a file-backed part (the unikernel's image,
    a restored snapshot's memory file) is read whole, its untouched pages
    being the file's."""

    def __init__(self, pid: int, addr: int, size: int) -> None:
        self.pid = pid
        self.addr = addr
        self.size = size
        try:
            self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise SnapshotError(f"cannot read the VM's memory: {err.strerror}") from None

    def __enter__(self) -> _ProcessMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def read(self, offset: int, length: int) -> bytes:
        try:
            data = os.pread(self.fd, length, self.addr + offset)
        except OSError as err:
            raise SnapshotError(f"cannot read the VM's memory: {err.strerror}") from None
        if len(data) != length:
            raise SnapshotError("cannot read the VM's memory: short read")
        return data

    def ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of guest memory that may hold data, in order."""
        out: list[tuple[int, int]] = []
        start, end = self.addr, self.addr + self.size
        covered = start
        with open(f"/proc/{self.pid}/maps") as maps, open(f"/proc/{self.pid}/pagemap", "rb") as pm:
            for line in maps:
                fields = line.split()
                low, high = (int(x, 16) for x in fields[0].split("-"))
                low, high = max(low, start), min(high, end)
                if low >= high:
                    continue
                if low != covered:
                    raise SnapshotError("the VM's guest memory is not one mapping")
                covered = high
                if fields[4] != "0":  # file-backed: all of it
                    out.append((low - start, high - low))
                    continue
                base = low - start
                for first, count in _used_runs(
                    pm_read(pm, low // PAGE_SIZE, (high - low) // PAGE_SIZE)
                ):
                    out.append((base + first * PAGE_SIZE, count * PAGE_SIZE))
        if covered != end:
            raise SnapshotError("the VM's guest memory is not one mapping")
        return out


def pm_read(pagemap, first: int, count: int) -> bytes:
    """``count`` pagemap entries from page ``first`` on, raw."""
    pagemap.seek(first * 8)
    raw = pagemap.read(count * 8)
    if len(raw) != count * 8:
        raise SnapshotError("cannot read the VM's page map: short read")
    return raw


#: 64 pagemap entries of pages never touched (no bit set at all).
_UNUSED_BLOCK = bytes(64 * 8)


def _used_runs(raw: bytes) -> list[tuple[int, int]]:
    """(first page, pages) of each run of present or swapped entries; the
    blocks of 64 untouched pages, most of a guest's memory, skipped whole."""
    runs: list[tuple[int, int]] = []
    run = None
    count = len(raw) // 8
    for block in range(0, count, 64):
        part = raw[block * 8 : (block + 64) * 8]
        if part == _UNUSED_BLOCK[: len(part)]:
            if run is not None:
                runs.append((run, block - run))
                run = None
            continue
        for i, (entry,) in enumerate(struct.iter_unpack("<Q", part), block):
            used = entry & (_PRESENT | _SWAPPED)
            if used and run is None:
                run = i
            elif not used and run is not None:
                runs.append((run, i - run))
                run = None
    if run is not None:
        runs.append((run, count - run))
    return runs


def write_guest_memory(fd: int, memory: _ProcessMemory) -> int:
    """The pages of ``memory`` that are not zero into the pre-sized,
    all-hole file ``fd`` at their offsets; how many were written."""
    zero_page = bytes(PAGE_SIZE)
    written = 0
    for offset, length in memory.ranges():
        for at in range(offset, offset + length, _CHUNK):
            chunk = memory.read(at, min(_CHUNK, offset + length - at))
            for page in range(0, len(chunk), PAGE_SIZE):
                data = chunk[page : page + PAGE_SIZE]
                if data != zero_page:
                    write_all(fd, data, at + page)
                    written += 1
    return written


def decode_state(text: str) -> bytes:
    """events.py's check of the vCPU state sent: base64 of at most
    CPU_STATE_LIMIT bytes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError('"state" must be base64') from None
    if not raw or len(raw) > CPU_STATE_LIMIT:
        raise ValueError(f'"state" must be 1 to {CPU_STATE_LIMIT} bytes')
    return raw

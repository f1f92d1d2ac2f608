"""--dumpcore=DIR: an ELF core of the guest when it faults or aborts.

The file is what solo5-hvt-debug writes, so the same tools read it
(``gdb guest.hvt core``): an ET_CORE ELF with one PT_NOTE holding an
NT_PRSTATUS note (the vCPU's registers, in Linux's ``elf_prstatus``
layout for x86_64 or aarch64) and an NT_PRFPREG note (the x87/SSE or
FP/SIMD registers, as Linux writes them), and guest memory as a PT_LOAD
at its guest-physical address, which is the guest's virtual address too (the guest's page tables map
memory one to one). Pages that hold only zeros are left as holes, so a
4 GiB guest makes a sparse file of the size of what it touched. The
name is ``core.solo5-hvt.PID``, said on stderr.

The sandbox refuses open, openat and link once the guest runs, so the
file is made before the filter goes on: an unnamed file (O_TMPFILE) in
DIR, which the core is written into with plain writes. Only a core that
was written gets a name. Without the sandbox pyvmm links the file into
DIR itself; with it, a helper process started before the filter
(corelink.py) does, on one byte from a pipe, and can do nothing else:
the filter stays as it is, pyvmm gains no call that takes a path. A run
that writes no core leaves nothing in DIR (the unnamed file goes with its
last fd). docs/debugging.md.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import TYPE_CHECKING

from pyvmm.common.errors import GuestFault, HostError
from pyvmm.common.sizes import PAGE_SIZE
from pyvmm.kvm.ioctl import KvmError
from pyvmm.loader.elf import (
    EHDR,
    ELF_MAGIC,
    ELFCLASS64,
    ELFDATA2LSB,
    EM_AARCH64,
    EM_X86_64,
    ET_CORE,
    EV_CURRENT,
    NHDR,
    PF_R,
    PF_W,
    PF_X,
    PHDR,
    PT_LOAD,
    PT_NOTE,
)
from pyvmm.vm.debug.regs import MACHINE, USER_REGS, guest_registers

# Imported with --dumpcore only, at set-up (the sandbox refuses a module's
# open at the fault).
if MACHINE == "aarch64":
    from pyvmm.arch.aarch64 import guestregs
else:
    from pyvmm.arch.x86_64 import fpu

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu
    from pyvmm.kvm.memory import GuestMemory

CORE_PREFIX = "core.solo5-hvt."

# <elf.h>, beyond what the loader reads (pyvmm/loader/elf.py).
_NT_PRSTATUS, _NT_PRFPREG = 1, 2
_ELFOSABI_STANDALONE = 255
_NOTE_NAME = b"CORE\0\0\0\0"  # a multiple of the word size, as Solo5 writes it

# Linux's struct elf_prstatus: pr_info (3 ints), pr_cursig, the signal
# sets, four pids, four timevals, then the registers (x86_64:
# user_regs_struct, 336 bytes in all; aarch64: user_pt_regs, 392) and
# pr_fpvalid, padded to 8.
_PRSTATUS_HEAD = struct.Struct("<iiih2xQQiiii64x")
_FPVALID = struct.Struct("<i4x")


class CoreArch:
    """What differs in a core between architectures: e_machine and the
    register set's names in NT_PRSTATUS order."""

    def __init__(self, machine: int, registers: tuple[str, ...]) -> None:
        self.machine, self.registers = machine, registers


def core_arch(machine: str) -> CoreArch | None:
    if machine == "x86_64":
        return CoreArch(EM_X86_64, tuple(USER_REGS))
    if machine == "aarch64":
        from pyvmm.arch.aarch64.guestregs import USER_REGS as AARCH64_REGS

        return CoreArch(EM_AARCH64, AARCH64_REGS)
    return None


SIGABRT, SIGSEGV = 6, 11

# Solo5's struct x86_trap_regs, the abort cookie of its trap handlers.
_TRAP_REGS = struct.Struct("<7Q")
_TRAP_FIELDS = ("cr2", "ec", "rip", "cs", "eflags", "rsp", "ss")

# Guest memory is scanned this much at a time for pages to write.
_CHUNK = 1 << 20
_ZERO_CHUNK = bytes(_CHUNK)
_ZERO_PAGE = bytes(PAGE_SIZE)
_MEMORY_OFFSET = PAGE_SIZE  # headers and note fit in the first page


def prstatus(
    regs: dict[str, int], *, signal: int, pid: int, names=tuple(USER_REGS), fpvalid: bool = False
) -> bytes:
    """An NT_PRSTATUS descriptor for ``regs`` (``names``: the register
    set's order; x86_64's user_regs_struct by default)."""
    head = _PRSTATUS_HEAD.pack(signal, 0, 0, signal, 0, 0, pid, 0, 0, 0)
    values = struct.pack(f"<{len(names)}Q", *(regs.get(n, 0) for n in names))
    return head + values + _FPVALID.pack(int(fpvalid))


def fp_note(vcpu: Vcpu, regs: dict[str, int]) -> bytes | None:
    """NT_PRFPREG's descriptor (x86_64: the FXSAVE image, Linux's
    user_i387_struct; aarch64: user_fpsimd_state), None if KVM cannot say."""
    try:
        if MACHINE == "aarch64":
            return guestregs.fpsimd(regs if "v0" in regs else guestregs.read_fp(vcpu))
        return fpu.get(vcpu)
    except KvmError:
        return None


def trap_registers(memory: GuestMemory, cookie: int) -> dict[str, int]:
    """What a Solo5 trap handler passed to solo5_abort (its cookie): the
    trapping instruction's rip, cs, rflags, rsp and ss; {} if unreadable."""
    try:
        values = _TRAP_REGS.unpack(memory.read(cookie, _TRAP_REGS.size, what="abort cookie"))
    except GuestFault:
        return {}
    fields = dict(zip(_TRAP_FIELDS, values, strict=True))
    return {name: fields[name] for name in ("rip", "cs", "eflags", "rsp", "ss")}


def _note(kind: int, desc: bytes) -> bytes:
    return NHDR.pack(len(_NOTE_NAME), len(desc), kind) + _NOTE_NAME + desc + bytes(-len(desc) % 4)


def headers(mem_size: int, note: bytes, fp: bytes | None = None, machine: int = EM_X86_64) -> bytes:
    """The ELF header, PT_NOTE and PT_LOAD headers and the notes
    (NT_PRSTATUS ``note``, NT_PRFPREG ``fp``), which the guest's memory
    follows at ``_MEMORY_OFFSET``."""
    ident = ELF_MAGIC + bytes([ELFCLASS64, ELFDATA2LSB, EV_CURRENT, _ELFOSABI_STANDALONE])
    ident += bytes(8)  # e_ident's padding, to its 16 bytes
    phoff = EHDR.size
    note_off = phoff + 2 * PHDR.size
    desc = _note(_NT_PRSTATUS, note) + (_note(_NT_PRFPREG, fp) if fp is not None else b"")
    ehdr = EHDR.pack(
        ident, ET_CORE, machine, EV_CURRENT, 0, phoff, 0, 0, EHDR.size, PHDR.size, 2, 0, 0, 0
    )
    pnote = PHDR.pack(PT_NOTE, 0, note_off, 0, 0, len(desc), len(desc), 0)
    rwx = PF_R | PF_W | PF_X
    pload = PHDR.pack(PT_LOAD, rwx, _MEMORY_OFFSET, 0, 0, mem_size, mem_size, PAGE_SIZE)
    out = ehdr + pnote + pload + desc
    if len(out) > _MEMORY_OFFSET:
        raise ValueError("core headers do not fit in a page")
    return out


def write_memory(fd: int, memory: GuestMemory) -> int:
    """Guest memory into ``fd`` from ``_MEMORY_OFFSET`` on, only the pages
    that are not all zero (the rest are holes); returns how many."""
    written = 0
    for gpa in range(0, memory.size, _CHUNK):
        length = min(_CHUNK, memory.size - gpa)
        try:
            data = memory.read(gpa, length, what="core dump")
        except GuestFault:  # pages gone (a truncated image file): a hole
            continue
        if data == _ZERO_CHUNK[:length]:
            continue
        start = None
        for off in range(0, length + PAGE_SIZE, PAGE_SIZE):
            zero = off >= length or data[off : off + PAGE_SIZE] == _ZERO_PAGE
            if not zero and start is None:
                start = off
            elif zero and start is not None:
                _pwrite_all(fd, memoryview(data)[start:off], _MEMORY_OFFSET + gpa + start)
                written += (off - start) // PAGE_SIZE
                start = None
    # The file's size is the whole PT_LOAD, holes at the end included.
    _pwrite_all(fd, b"\0", _MEMORY_OFFSET + memory.size - 1)
    return written


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class CoreDir:
    """--dumpcore=DIR, opened at set-up: the directory, then (``prepare``,
    right before the sandbox) the unnamed file and, if the run is
    sandboxed, the helper that will name it."""

    def __init__(self, path: str, machine: str) -> None:
        arch = core_arch(machine)
        if arch is None:
            raise HostError(f"--dumpcore: not implemented for {machine} guests")
        self.arch = arch
        self.path = path
        self.dir_fd = self.file_fd = self._to_helper = self._from_helper = -1
        try:
            self.dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise HostError(
                f"--dumpcore={path}: cannot open the directory: {err.strerror}"
            ) from None
        if not os.access(".", os.W_OK, dir_fd=self.dir_fd):
            os.close(self.dir_fd)
            raise HostError(f"--dumpcore={path}: the directory is not writable")

    def prepare(self, *, sandboxed: bool) -> None:
        """The unnamed file the core will be written into and, with the
        sandbox, the helper process that names it (docstring above)."""
        try:
            self.file_fd = os.open(
                ".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd
            )
        except OSError as err:
            raise HostError(
                f"--dumpcore={self.path}: cannot make an unnamed file there (O_TMPFILE): "
                f"{err.strerror}"
            ) from None
        if sandboxed:
            self._start_helper()

    def _start_helper(self) -> None:
        # The helper's path, not an import of it: under --user the run has
        # already dropped privileges here, and an import of what it imports
        # (signal) could meet an interpreter whose library only root reads.
        helper = os.path.join(os.path.dirname(__file__), "corelink.py")
        to_r, to_w = os.pipe2(os.O_CLOEXEC)
        from_r, from_w = os.pipe2(os.O_CLOEXEC)
        # The helper's fds 3-6: the directory, the file, its two pipe ends;
        # 0-2 /dev/null, so it never holds pyvmm's console or stderr open.
        actions: list[tuple] = [
            (os.POSIX_SPAWN_DUP2, fd, 3 + i)
            for i, fd in enumerate((self.dir_fd, self.file_fd, to_r, from_w))
        ]
        actions += [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        argv = [sys.executable, "-I", "-S", helper, self.name()]
        try:
            os.posix_spawn(sys.executable, argv, {}, file_actions=actions, setsid=True)
        except OSError as err:
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            raise HostError(f"--dumpcore: cannot start the core's helper: {err.strerror}") from None
        os.close(to_r)
        os.close(from_w)
        self._to_helper, self._from_helper = to_w, from_r

    def name(self) -> str:
        return f"{CORE_PREFIX}{os.getpid()}"

    def dump_guest(
        self, memory: GuestMemory, vcpu: Vcpu, *, signal: int, halt_gpa: int | None = None
    ) -> None:
        """The core of a guest that faulted (its vCPU's registers) or
        aborted (``halt_gpa``: its halt hypercall's arguments, whose cookie
        may carry a trap handler's registers)."""
        regs = guest_registers(vcpu, memory)
        if halt_gpa is not None:
            try:
                (cookie,) = struct.unpack("<Q", memory.read(halt_gpa, 8, what="halt hypercall"))
            except GuestFault:
                cookie = 0
            if cookie and self.arch.machine == EM_X86_64:  # Solo5's x86 trap frame
                regs |= trap_registers(memory, cookie)
        self.dump(memory, regs, signal=signal, fp=fp_note(vcpu, regs))

    def dump(
        self, memory: GuestMemory, regs: dict[str, int], *, signal: int, fp: bytes | None = None
    ) -> None:
        """Write the core and name it; say where (or why not) on stderr.
        Never raises: the run ends with its own status either way."""
        where = os.path.join(self.path, self.name())
        try:
            if self.file_fd < 0:
                raise OSError(0, "the core file was not prepared")
            arch = self.arch
            note = prstatus(
                regs, signal=signal, pid=os.getpid(), names=arch.registers, fpvalid=fp is not None
            )
            _pwrite_all(self.file_fd, headers(memory.size, note, fp, arch.machine), 0)
            pages = write_memory(self.file_fd, memory)
            self._link()
        except (OSError, ValueError) as err:
            why = getattr(err, "strerror", None) or str(err)
            _say(f"dumpcore: cannot write {where}: {why}")
            return
        _say(f"dumpcore: dumping guest core to: {where}")
        _say(f"dumpcore: dumped {pages} pages of total {memory.size // PAGE_SIZE} pages")

    def _link(self) -> None:
        if self._to_helper < 0:  # not sandboxed: pyvmm may link it itself
            os.link(f"/proc/self/fd/{self.file_fd}", self.name(), dst_dir_fd=self.dir_fd)
            return
        os.write(self._to_helper, b"L")
        reply = os.read(self._from_helper, 256)
        if reply != b"ok":
            raise OSError(0, reply.decode(errors="replace") or "the helper ended")

    def close(self) -> None:
        for attr in ("_to_helper", "_from_helper", "file_fd", "dir_fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                os.close(fd)


def _say(line: str) -> None:
    """A line on stderr without the logging module (which the sandbox
    would not let Python import now)."""
    try:
        os.write(2, f"pyvmm: {line}\n".encode(errors="replace"))
    except OSError:
        pass

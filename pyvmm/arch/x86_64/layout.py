"""pyvmm's own pages in the guest's low area: the TSS and, in deprivileged
mode, the trap tables (IDT and stubs) and the trap stack.

Where they are and what the trap tables hold, written once for the three
modules that need them: boot.py places the pages and fills them, cpu.py
loads the IDT, traps.py reads the frames the stubs leave (docs/pvm.md).
Nothing here imports another module of the architecture.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import lib

if TYPE_CHECKING:
    from pyvmm.kvm.memory import GuestMemory

# Deprivileged mode only (docs/pvm.md): pyvmm's GDT, IDT and trap stubs on
# one page, its trap stack on the next, both supervisor-only so the guest
# (at CPL 3) can neither read nor write them. Free low-area pages: the boot
# info, manifest copy and command line end below 0x14000, the TSS starts at
# PYVMM_TSS_BASE.
TRAP_TABLES = 0x1A000
TRAP_STACK = 0x1B000
TRAP_STACK_TOP = TRAP_STACK + 0x1000
#: The code segment the stubs run in (CPL 0), in pyvmm's GDT (boot.TRAP_CODE).
TRAP_CODE_SELECTOR = 0x30

# The user-mode TSS: 104 bytes, then an I/O permission bitmap of all zeros
# (every port allowed) and the 0xff byte that must end it. Measured under
# kvm_pvm: RFLAGS.IOPL=3 alone does not let CPL 3 execute `out` (it raises
# #GP); the bitmap does.
TSS_BASE = lib.PYVMM_TSS_BASE
TSS_SIZE = 104
TSS_IOMAP_SIZE = 65536 // 8
TSS_LIMIT = TSS_SIZE + TSS_IOMAP_SIZE  # inclusive: covers the 0xff byte

VECTORS = 32
IDT = TRAP_TABLES + 0x100
IDT_LIMIT = VECTORS * 16 - 1
STUBS = TRAP_TABLES + 0x400
STUB_SIZE = 8
#: Vector v's stub writes to port TRAP_PORTS + v (``out %al, $imm8``). The
#: TSS's I/O bitmap denies these ports at CPL 3, so only a stub can.
TRAP_PORTS = 0xC0
#: The CPU's frame sits at the top of the trap stack (TSS.RSP0): nothing
#: nests, a fault inside a stub is reported as pyvmm's bug.
FRAME_WORDS = 5

#: Vectors whose frame carries an error code.
ERROR_CODE_VECTORS = frozenset({8, 10, 11, 12, 13, 14, 17, 21, 29, 30})

GATE_INTERRUPT = 0xE
GATE_TRAP = 0xF


def gate(offset: int, selector: int, ist: int = 0, kind: int = GATE_INTERRUPT, dpl: int = 0):
    """A 16-byte 64-bit IDT gate."""
    attributes = 0x80 | (dpl << 5) | kind
    return struct.pack(
        "<HHBBHII", offset & 0xFFFF, selector, ist, attributes, (offset >> 16) & 0xFFFF,
        offset >> 32, 0,
    )  # fmt: skip


def stub(vector: int) -> bytes:
    """``out %al, $port``; drop the error code if the CPU pushed one; ``iretq``."""
    code = bytes([0xE6, TRAP_PORTS + vector])
    if vector in ERROR_CODE_VECTORS:
        code += bytes.fromhex("4883c408")  # add $8, %rsp
    return (code + bytes.fromhex("48cf")).ljust(STUB_SIZE, b"\xcc")


def frame_address(vector: int) -> int:
    return TRAP_STACK_TOP - 8 * (FRAME_WORDS + (vector in ERROR_CODE_VECTORS))


def write_tables(memory: GuestMemory) -> None:
    """pyvmm's IDT (every exception vector to its stub) and the stubs."""
    gates = b"".join(gate(STUBS + v * STUB_SIZE, TRAP_CODE_SELECTOR) for v in range(VECTORS))
    memory.write(IDT, gates)
    memory.write(STUBS, b"".join(stub(v) for v in range(VECTORS)))
    # The guest may not write the stubs' ports (it could fake a trap).
    assert TRAP_PORTS % 8 == 0 and VECTORS % 8 == 0
    memory.write(TSS_BASE + TSS_SIZE + TRAP_PORTS // 8, b"\xff" * (VECTORS // 8))

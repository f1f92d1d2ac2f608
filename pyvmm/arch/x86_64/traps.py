"""Deprivileged execution: trap and emulate for unmodified kernel-mode guests.

A Solo5 hvt unikernel expects to run at CPL 0, which kvm_pvm executes in
its instruction emulator (about a thousand times slower than native). In
deprivileged mode pyvmm starts it at CPL 3 instead (docs/pvm.md). The few
privileged instructions it executes (lgdt, lidt, ltr, a far return to its
own code selector, a load of SS, wrmsr of the FS base, mov from CR2,
cli/sti) then raise #GP; every exception enters one of pyvmm's own IDT
stubs, which runs at CPL 0 on pyvmm's trap stack and exits with a 1-byte
``out`` to its own port. Here the exit is read back: the vector from the
port the stub wrote to, the CPU's frame from the trap stack. A privileged
instruction is decoded (decode.py) and its effect applied to the guest's
registers and to a shadow of the privileged state the guest believes it
set (GDTR, IDTR, TR, CR2, the interrupt flag); any other exception is
delivered to the guest's own IDT handler, on the IST stack its TSS names,
as the hardware would. Either way pyvmm rewrites the CPU's frame on the
trap stack and the stub returns to the guest with ``iretq``: a trap costs
no register ioctl unless the instruction reads or writes registers (and
KVM_SET_SREGS, which makes kvm_pvm rebuild its shadow page tables, only
for a new FS or GS base).

The IDT, the stubs and pyvmm's GDT share a supervisor-only read-only page
of the low area, the trap stack a supervisor-only writable one
(layout.TRAP_TABLES, layout.TRAP_STACK): the guest can neither read nor write
them.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyvmm.arch.x86_64 import cpu
from pyvmm.arch.x86_64.boot import DEPRIVILEGED, GUEST_CODE, GUEST_DATA, Segment
from pyvmm.arch.x86_64.cpu import (
    RFLAGS_IF,
    RFLAGS_IOPL,
    RFLAGS_NT,
    RFLAGS_RESERVED,
    RFLAGS_RF,
    RFLAGS_TF,
    RFLAGS_VM,
)
from pyvmm.arch.x86_64.decode import GPR, DecodeError, Instruction, Memory, decode
from pyvmm.arch.x86_64.faults import explain_page_fault
from pyvmm.arch.x86_64.layout import (  # (also read here by debug/regs.py)
    ERROR_CODE_VECTORS,
    FRAME_WORDS,
    GATE_INTERRUPT,
    GATE_TRAP,
    TRAP_PORTS,
    TRAP_STACK_TOP,
    VECTORS,
    frame_address,
)
from pyvmm.common.errors import GuestFault
from pyvmm.kvm import IoOut

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu, VcpuExit
    from pyvmm.kvm.memory import GuestMemory

VECTOR_NAMES = {
    0: "#DE", 1: "#DB", 2: "NMI", 3: "#BP", 4: "#OF", 5: "#BR", 6: "#UD", 7: "#NM",
    8: "#DF", 10: "#TS", 11: "#NP", 12: "#SS", 13: "#GP", 14: "#PF", 16: "#MF",
    17: "#AC", 18: "#MC", 19: "#XM", 20: "#VE", 21: "#CP",
}  # fmt: skip
GP, UD, PF, BP, DB = 13, 6, 14, 3, 1

PF_USER = 1 << 2

MSR_FS_BASE = 0xC0000100
MSR_GS_BASE = 0xC0000101
MSR_KERNEL_GS_BASE = 0xC0000102
_BASE_MSRS = (MSR_FS_BASE, MSR_GS_BASE, MSR_KERNEL_GS_BASE)

TSS_AVAILABLE = 0x9
TSS_BUSY = 0xB
TSS_IST1 = 36

_MASK64 = (1 << 64) - 1


class Unsupported(GuestFault):
    """A privileged operation pyvmm does not emulate: the run ends."""


class Shadow:
    """The privileged state the guest believes it set (never loaded)."""

    __slots__ = (
        "gdt_base", "gdt_limit", "idt_base", "idt_limit", "tr", "tss_base", "cr2", "interrupts",
        "kernel_gs_base",
    )  # fmt: skip

    def __init__(self) -> None:
        self.gdt_base = self.gdt_limit = 0
        self.idt_base = 0
        self.idt_limit = 0  # 0: no IDT loaded yet
        self.tr = 0
        self.tss_base: int | None = None
        self.cr2 = 0
        self.interrupts = False
        self.kernel_gs_base = 0


class Frame:
    """The guest at the trap: the CPU's frame, and its registers on demand.

    Registers and segment state are read from KVM only when an instruction
    needs them, and written back only when changed (``dirty``).
    """

    def __init__(self, vcpu: Vcpu, vector: int, words: tuple[int, ...]) -> None:
        self.vcpu = vcpu
        self.vector = vector
        if vector in ERROR_CODE_VECTORS:
            self.error_code, words = words[0], words[1:]
        else:
            self.error_code = None
        self.rip, cs, self.rflags, self.rsp, ss = words
        self.cs, self.ss = cs & 0xFFFF, ss & 0xFFFF
        self.code = b""  # the instruction's bytes, once fetched
        self.debugged = False  # a debugger stopped the guest at this trap
        self._regs = self._sregs = None
        self.regs_dirty = self.sregs_dirty = False

    @property
    def regs(self):
        if self._regs is None:
            self._regs = cpu.get_regs(self.vcpu)
        return self._regs

    @property
    def sregs(self):
        if self._sregs is None:
            self._sregs = cpu.get_sregs(self.vcpu)
        return self._sregs

    def reg(self, name: str) -> int:
        return self.rsp if name == "rsp" else getattr(self.regs, name)

    def set_reg(self, number: int, value: int) -> None:
        name = GPR[number]
        if name == "rsp":
            self.rsp = value & _MASK64
        else:
            setattr(self.regs, name, value & _MASK64)
            self.regs_dirty = True


class TrapEmulator:
    """Answers the trap exits of one deprivileged vCPU (see module doc)."""

    def __init__(self, vcpu: Vcpu, memory: GuestMemory) -> None:
        self.vcpu = vcpu
        self.memory = memory
        self.shadow = Shadow()
        self.counts: Counter[str] = Counter()
        #: A GDB stub's ``trap_stop(frame, vector, address) -> bool``
        #: (pyvmm/vm/debug/gdbstub.py): offered the guest's #DB and int3 before
        #: the guest's own handler; True when they were the debugger's.
        self.debugger: Callable[[Frame, int, int], bool] | None = None

    # -- the exit ------------------------------------------------------------
    def handle(self, exit: VcpuExit) -> bool:
        """True when ``exit`` was a trap, answered; False for any other exit."""
        vector = exit.port - TRAP_PORTS if type(exit) is IoOut else -1
        if not 0 <= vector < VECTORS or exit.size != 1:
            return False
        words = 1 + FRAME_WORDS if vector in ERROR_CODE_VECTORS else FRAME_WORDS
        raw = self.memory.read(frame_address(vector), 8 * words, what="trap frame")
        frame = Frame(self.vcpu, vector, struct.unpack(f"<{words}Q", raw))
        if frame.cs & 3 != 3:
            raise GuestFault(
                f"guest fault: {self._name(vector)} inside pyvmm's trap entry "
                f"(rip={frame.rip:#x}): a bug in pyvmm, please report it"
            )
        if vector == PF:
            self.shadow.cr2 = frame.sregs.cr2
        if vector in (DB, BP) and self._debugger(frame, vector, frame.rip - (vector == BP)):
            pass
        elif vector in (GP, UD):
            self._privileged(frame)
            if frame.rflags & RFLAGS_TF and not frame.debugged:  # a step over it ends
                self._debugger(frame, DB, frame.rip)
        else:
            self._exception(frame, vector)
        self._resume(frame)
        return True

    def counters(self) -> dict[str, int]:
        return dict(self.counts)

    def _exception(self, frame: Frame, vector: int) -> None:
        """A hardware exception for the guest's own handler. A debugger sees
        it first (gdb stops at the faulting instruction, as for a process's
        signal), where the guest has a handler: one without is a fault of
        the run, which the run loop reports to the debugger itself."""
        if self.debugger is not None and self.shadow.idt_limit >= vector * 16 + 15:
            self.debugger(frame, vector, frame.rip)
        self._deliver(frame, vector, frame.error_code, frame.rip)

    def _debugger(self, frame: Frame, vector: int, address: int) -> bool:
        if self.debugger is None or not self.debugger(frame, vector, address):
            return False
        frame.debugged = True
        return True

    # -- privileged instructions ----------------------------------------------
    def _privileged(self, frame: Frame) -> None:
        code = frame.code = self._fetch(frame.rip)
        try:
            insn = decode(code)
        except DecodeError as err:
            if frame.vector == GP and "not an instruction" not in str(err):
                raise Unsupported(self._unsupported(frame, str(err))) from None
            # Not a privileged instruction pyvmm knows: a genuine #GP or #UD
            # (ud2, a non-canonical address) for the guest's own handler.
            self._exception(frame, frame.vector)
            return
        handler = getattr(self, f"_do_{insn.name}", None)
        frame.code = code[: insn.length]
        if handler is None:
            raise Unsupported(self._unsupported(frame, insn.name))
        self.counts[insn.name] += 1
        next_rip = frame.rip + insn.length
        if handler(frame, insn, next_rip) is not False:
            frame.rip = next_rip

    def _fetch(self, rip: int) -> bytes:
        if not 0 <= rip < self.memory.size:
            raise GuestFault(f"guest fault: instruction fetch at {rip:#x}, outside guest memory")
        return self.memory.read(rip, min(15, self.memory.size - rip), what="instruction fetch")

    def _unsupported(self, frame: Frame, what: str) -> str:
        return (
            f"guest fault: privileged instruction pyvmm does not emulate ({what}): "
            f"bytes {frame.code.hex(' ')} at rip={frame.rip:#x}; run it with --cpl=0"
        )

    def _address(self, frame: Frame, insn: Instruction) -> int:
        rm = insn.rm
        assert isinstance(rm, Memory)
        seg_base = 0
        if rm.segment in ("fs", "gs"):
            seg_base = getattr(frame.sregs, rm.segment).base
        return rm.address(frame.reg, frame.rip + insn.length, seg_base)

    def _read(self, address: int, size: int) -> int:
        return int.from_bytes(
            self.memory.read(address, size, what="emulated instruction"), "little"
        )

    def _operand16(self, frame: Frame, insn: Instruction) -> int:
        if isinstance(insn.rm, int):
            return frame.reg(GPR[insn.rm]) & 0xFFFF
        return self._read(self._address(frame, insn), 2)

    def _do_cli(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        self.shadow.interrupts = False

    def _do_sti(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        self.shadow.interrupts = True

    def _do_hlt(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        # As at level 0, where the halted CPU's RIP is past the hlt (the
        # frame too: the fault report and a core file read the guest there).
        frame.rip = next_rip
        self._resume(frame)
        raise GuestFault(
            f"guest halted the CPU without the halt hypercall ({self._where(frame, next_rip)})"
        )

    def _do_lgdt(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        address = self._address(frame, insn)
        self.shadow.gdt_limit = self._read(address, 2)
        self.shadow.gdt_base = self._read(address + 2, 8)

    def _do_lidt(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        address = self._address(frame, insn)
        self.shadow.idt_limit = self._read(address, 2)
        self.shadow.idt_base = self._read(address + 2, 8)

    def _do_ltr(self, frame: Frame, insn: Instruction, next_rip: int) -> bool | None:
        selector = self._operand16(frame, insn)
        offset = selector & ~7
        if selector & 4 or offset + 15 > self.shadow.gdt_limit:
            raise Unsupported(self._unsupported(frame, f"ltr {selector:#x}: no such TSS"))
        descriptor = self.shadow.gdt_base + offset
        low, high = struct.unpack("<QQ", self.memory.read(descriptor, 16))
        kind = (low >> 40) & 0xF
        if kind not in (TSS_AVAILABLE, TSS_BUSY) or not (low >> 47) & 1:
            raise Unsupported(self._unsupported(frame, f"ltr {selector:#x}: not a TSS"))
        if kind == TSS_BUSY:  # the CPU's #GP(selector): a TSS is loaded once
            self._deliver(frame, GP, selector & 0xFFFC, frame.rip)
            return False
        base = ((low >> 16) & 0xFFFFFF) | (((low >> 56) & 0xFF) << 24) | ((high & 0xFFFFFFFF) << 32)
        # The CPU marks the descriptor busy in the guest's own GDT.
        access = (low >> 40) & 0xFF
        self.memory.store(descriptor + 5, bytes([access | (TSS_BUSY ^ TSS_AVAILABLE)]), what="GDT")
        self.shadow.tr = selector
        self.shadow.tss_base = base
        return None

    def _do_mov_to_sreg(self, frame: Frame, insn: Instruction, next_rip: int) -> bool | None:
        selector = self._operand16(frame, insn)
        names = {0: "es", 2: "ss", 3: "ds", 4: "fs", 5: "gs"}
        name = names.get(insn.reg & 7)
        if name is None:
            raise Unsupported(self._unsupported(frame, "mov to CS"))
        segment = self._real_segment(frame, selector, GUEST_DATA)
        if name == "ss":
            if self._rpl_fault(frame, selector, code=False):
                return False
            frame.ss = segment.selector | 3
        else:
            kvm_seg = getattr(frame.sregs, name)
            base = kvm_seg.base
            segment.load(kvm_seg)
            if name in ("fs", "gs"):
                kvm_seg.base = base  # a selector load leaves the MSR base in 64-bit code
            frame.sregs_dirty = True
        return None

    def _do_retf(self, frame: Frame, insn: Instruction, next_rip: int, extra: int = 0) -> bool:
        size = insn.operand_size // 8
        rip = self._read(frame.rsp, size)
        selector = self._read(frame.rsp + size, size) & 0xFFFF
        segment = self._real_segment(frame, selector, GUEST_CODE)
        if self._rpl_fault(frame, selector, code=True):
            return False
        frame.rip = rip
        frame.cs = segment.selector | 3
        frame.rsp = (frame.rsp + 2 * size + extra) & _MASK64
        return False  # the return set RIP

    def _do_retf_imm(self, frame: Frame, insn: Instruction, next_rip: int) -> bool:
        return self._do_retf(frame, insn, next_rip, insn.immediate or 0)

    def _do_iret(self, frame: Frame, insn: Instruction, next_rip: int) -> bool:
        size = 8 if insn.operand_size == 64 else 4
        words = [self._read(frame.rsp + i * size, size) for i in range(5)]
        rip, cs, rflags, rsp, ss = words
        code = self._real_segment(frame, cs & 0xFFFF, GUEST_CODE)
        stack = self._real_segment(frame, ss & 0xFFFF, GUEST_DATA)
        if self._rpl_fault(frame, cs & 0xFFFF, code=True):
            return False
        if self._rpl_fault(frame, ss & 0xFFFF, code=False):
            return False
        frame.cs, frame.ss = code.selector | 3, stack.selector | 3
        self.shadow.interrupts = bool(rflags & RFLAGS_IF)
        frame.rflags = _guest_rflags(rflags)
        frame.rip, frame.rsp = rip, rsp
        return False

    def _do_mov_from_cr(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        sregs = frame.sregs
        values = {0: sregs.cr0, 2: self.shadow.cr2, 3: sregs.cr3, 4: sregs.cr4, 8: 0}
        if insn.reg not in values:
            raise Unsupported(self._unsupported(frame, f"mov from CR{insn.reg}"))
        assert isinstance(insn.rm, int)
        frame.set_reg(insn.rm, values[insn.reg])

    def _do_wrmsr(self, frame: Frame, insn: Instruction, next_rip: int) -> bool | None:
        msr = frame.regs.rcx & 0xFFFFFFFF
        value = ((frame.regs.rdx & 0xFFFFFFFF) << 32) | (frame.regs.rax & 0xFFFFFFFF)
        if msr in _BASE_MSRS and not _canonical(value, cpu.linear_address_bits()):
            self._deliver(frame, GP, 0, frame.rip)  # the CPU's #GP(0)
            return False
        if msr == MSR_FS_BASE:
            frame.sregs.fs.base = value
            frame.sregs_dirty = True
        elif msr == MSR_GS_BASE:
            frame.sregs.gs.base = value
            frame.sregs_dirty = True
        elif msr == MSR_KERNEL_GS_BASE:
            self.shadow.kernel_gs_base = value
        else:
            raise Unsupported(self._unsupported(frame, f"wrmsr {msr:#x}"))
        return None

    def _do_rdmsr(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        msr = frame.regs.rcx & 0xFFFFFFFF
        values = {
            MSR_FS_BASE: frame.sregs.fs.base,
            MSR_GS_BASE: frame.sregs.gs.base,
            MSR_KERNEL_GS_BASE: self.shadow.kernel_gs_base,
        }
        if msr not in values:
            raise Unsupported(self._unsupported(frame, f"rdmsr {msr:#x}"))
        frame.regs.rax = values[msr] & 0xFFFFFFFF
        frame.regs.rdx = values[msr] >> 32
        frame.regs_dirty = True

    def _do_swapgs(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        gs = frame.sregs.gs
        gs.base, self.shadow.kernel_gs_base = self.shadow.kernel_gs_base, gs.base
        frame.sregs_dirty = True

    def _do_invlpg(self, frame: Frame, insn: Instruction, next_rip: int) -> None:
        """Nothing to do: pyvmm's page tables never change under the guest."""

    _do_wbinvd = _do_invd = _do_invlpg

    def _do_int3(self, frame: Frame, insn: Instruction, next_rip: int) -> bool:
        if self._debugger(frame, BP, frame.rip):  # a debugger's breakpoint
            return False
        self._deliver(frame, BP, None, next_rip)
        return False

    def _do_int(self, frame: Frame, insn: Instruction, next_rip: int) -> bool:
        self._deliver(frame, insn.immediate or 0, None, next_rip)
        return False

    def _rpl_fault(self, frame: Frame, selector: int, *, code: bool) -> bool:
        """A CS or SS selector whose RPL is not the level the guest believes
        it runs at (0) faults as on the CPU, #GP(selector): True when so.
        For CS, unless the guest's own descriptor has that DPL: that is a
        return to an outer level, and pyvmm runs the guest at one level."""
        rpl = selector & 3
        if not rpl:
            return False
        offset = selector & ~7
        if code and offset + 7 <= self.shadow.gdt_limit:
            descriptor = self._read(self.shadow.gdt_base + offset, 8)
            if (descriptor >> 45) & 3 == rpl:
                raise Unsupported(self._unsupported(frame, f"a return to CPL {rpl}"))
        self._deliver(frame, GP, selector & 0xFFFC, frame.rip)
        return True

    def _real_segment(self, frame: Frame, selector: int, wanted: Segment) -> Segment:
        """The descriptor pyvmm's GDT has at the guest's selector index."""
        if selector >> 3 != wanted.selector >> 3 or selector & 4:
            raise Unsupported(
                self._unsupported(
                    frame, f"segment selector {selector:#x} (only {wanted.selector:#x})"
                )
            )
        return wanted

    # -- exceptions for the guest ----------------------------------------------
    def _deliver(self, frame: Frame, vector: int, error_code: int | None, rip: int) -> None:
        """Enter the guest's own handler for ``vector`` as the CPU would."""
        shadow = self.shadow
        name = self._name(vector)
        self.counts[f"deliver {name}"] += 1
        if shadow.idt_limit < vector * 16 + 15:
            if vector == PF:
                what = explain_page_fault(self.memory, rip, shadow.cr2)
            else:
                what = f"triple fault (unhandled exception {name})"
            raise GuestFault(f"guest fault: {what} ({self._where(frame, rip)})")
        low, high = struct.unpack(
            "<QQ", self.memory.read(shadow.idt_base + vector * 16, 16, what="guest IDT")
        )
        kind = (low >> 40) & 0xF
        if not (low >> 47) & 1 or kind not in (GATE_INTERRUPT, GATE_TRAP):
            raise GuestFault(
                f"guest fault: {name} at rip={rip:#x} and the guest's IDT has no gate for it"
            )
        handler = (low & 0xFFFF) | (((low >> 48) & 0xFFFF) << 16) | ((high & 0xFFFFFFFF) << 32)
        code = self._real_segment(frame, (low >> 16) & 0xFFFF, GUEST_CODE)
        ist = (low >> 32) & 7
        rsp = frame.rsp
        if ist:
            if shadow.tss_base is None:
                raise GuestFault(f"guest fault: {name} on IST{ist} with no TSS loaded")
            rsp = self._read(shadow.tss_base + TSS_IST1 + 8 * (ist - 1), 8)
        rsp &= ~0xF
        if vector == PF and error_code is not None:
            error_code &= ~PF_USER  # the guest believes it ran at CPL 0
        view_flags = frame.rflags | (RFLAGS_IF if shadow.interrupts else 0)
        words = [frame.ss & ~3, frame.rsp, view_flags, frame.cs & ~3, rip]
        if error_code is not None:
            words.append(error_code)
        new_rsp = (rsp - 8 * len(words)) & _MASK64
        # Guarded: the stack may be a page of a restored snapshot's file.
        frame_bytes = struct.pack(f"<{len(words)}Q", *reversed(words))
        self.memory.store(new_rsp, frame_bytes, what=f"{name} frame")
        if kind == GATE_INTERRUPT:
            shadow.interrupts = False
        frame.rflags &= ~(RFLAGS_TF | RFLAGS_NT | RFLAGS_RF | RFLAGS_VM)
        frame.rip = handler
        frame.rsp = new_rsp
        frame.cs = code.selector | 3

    def _where(self, frame: Frame, rip: int) -> str:
        """Where the guest is, in a fault's words (cpu.where at level 0),
        with the CR2 the guest sees."""
        return f"rip={rip:#x} rsp={frame.rsp:#x} cr2={self.shadow.cr2:#x}"

    @staticmethod
    def _name(vector: int) -> str:
        return VECTOR_NAMES.get(vector, f"vector {vector}")

    # -- back to the guest -----------------------------------------------------
    def _resume(self, frame: Frame) -> None:
        """Rewrite the CPU's frame (the stub's iretq returns through it) and
        whatever registers the instruction changed."""
        if not (_canonical(frame.rip) and _canonical(frame.rsp)):
            raise GuestFault(
                f"guest fault: return to a non-canonical address "
                f"(rip={frame.rip:#x} rsp={frame.rsp:#x})"
            )
        rflags = _guest_rflags(frame.rflags)
        words = (frame.rip, GUEST_CODE.selector | 3, rflags, frame.rsp, GUEST_DATA.selector | 3)
        at = TRAP_STACK_TOP - 8 * FRAME_WORDS
        self.memory.write(at, struct.pack(f"<{FRAME_WORDS}Q", *words), what="trap frame")
        if frame.sregs_dirty:
            cpu.set_sregs(self.vcpu, frame.sregs)
        if frame.regs_dirty:
            cpu.set_regs(self.vcpu, frame.regs)


def _guest_rflags(rflags: int) -> int:
    """The flags the guest runs on with, from the ones it asked for: IF,
    IOPL and VM are pyvmm's (IF lives in the shadow state), the reserved
    bit always set."""
    return (rflags & ~(RFLAGS_IF | RFLAGS_IOPL | RFLAGS_VM)) | RFLAGS_RESERVED


def _canonical(address: int, bits: int = 48) -> bool:
    """Bits 63 down to ``bits`` - 1 all equal (48: 4-level paging's width)."""
    top = address >> (bits - 1)
    return top == 0 or top == (1 << (65 - bits)) - 1


def emulator(mode: str, vcpu: Vcpu, memory: GuestMemory) -> TrapEmulator | None:
    return TrapEmulator(vcpu, memory) if mode == DEPRIVILEGED.name else None

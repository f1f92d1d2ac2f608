"""Debugging on arm64 KVM: the GDB stub (driven by a raw remote-protocol
client: this machine has no gdb) and --dumpcore's ELF core, parsed here.

The stub: the aarch64 target description, a software breakpoint (brk #0
under KVM_GUESTDBG_USE_SW_BP) at solo5_app_main from the ELF's symbols,
registers read and written through KVM_{GET,SET}_ONE_REG (x0-x30, sp,
pc, cpsr, v0-v31, fpsr, fpcr), memory through the accessor, a single step
(KVM_GUESTDBG_SINGLESTEP), a hardware breakpoint where KVM offers one,
write, read and access watchpoints (stopping before the access, stepped
over on resume), Ctrl-C, a faulting guest stopping at its faulting instruction, and the
guest running to its exit. The core: EM_AARCH64, NT_PRSTATUS in Linux's
aarch64 layout whose pc is the faulting instruction, NT_PRFPREG, memory
as a PT_LOAD."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

# Collected on aarch64 hosts only (tests/conftest.py): scripts/test-aarch64.
from conftest import guest, popen_pyvmm, run_pyvmm
from testkit.rspclient import RawClient

HERE = Path(__file__).resolve().parent
TIMEOUT = 300  # a hang guard: the machine is emulated
WAITING = re.compile(r"pyvmm: gdb: waiting for a debugger on (\S+);")
FAULT_PC = re.compile(r"\(pc=(0x[0-9a-f]+) ")
PC, CPSR, X0, SP, V0, FPSR = 32, 33, 0, 31, 34, 66
G_SIZE = 31 * 8 + 8 + 8 + 4 + 32 * 16 + 4 + 4


def symbol(kernel: Path, name: str) -> int:
    from pyvmm.vm.debug.symbols import SymbolFile

    symbols = SymbolFile.open(str(kernel))
    try:
        address = symbols.address_of(name)
    finally:
        symbols.close()
    assert address is not None, name
    return address


def entry(kernel: Path) -> int:
    return struct.unpack_from("<Q", kernel.read_bytes(), 24)[0]


def u64(reply: bytes) -> int:
    assert re.fullmatch(rb"[0-9a-f]+", reply), reply
    return int.from_bytes(bytes.fromhex(reply.decode()), "little")


class Stub:
    """pyvmm waiting for a debugger on a Unix socket, and the client on it."""

    def __init__(self, tmp: Path, kernel: Path, *args: str) -> None:
        self.kernel = kernel
        path = tmp / "gdb.sock"
        self.pyvmm = popen_pyvmm(f"--gdb-socket={path}", kernel, *args)
        line = self.pyvmm.stderr.readline()
        assert WAITING.match(line), line + self.finish()[1]
        self.client = RawClient(path=str(path), timeout=TIMEOUT)

    def finish(self) -> tuple[str, str, int]:
        try:
            out, err = self.pyvmm.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.pyvmm.kill()
            out, err = self.pyvmm.communicate()
        return out, err, self.pyvmm.returncode


@pytest.fixture
def stub(tmp_path):
    started: list[Stub] = []

    def start(kernel: Path, *args: str) -> Stub:
        started.append(Stub(tmp_path, kernel, *args))
        return started[-1]

    yield start
    for s in started:  # never leave a pyvmm behind, also on failure
        if s.pyvmm.poll() is None:
            s.pyvmm.kill()
            s.pyvmm.communicate()


def test_register_and_debug_ids_match_the_kernel_headers():
    from pyvmm.arch.aarch64 import debug, guestregs

    printed = dict(
        line.split() for line in subprocess.check_output([HERE / "regids"], text=True).splitlines()
    )
    for name, value in guestregs.table().items():
        assert int(printed[name]) == value, name
    assert int(printed["KVM_SET_GUEST_DEBUG"]) == debug.KVM_SET_GUEST_DEBUG
    assert int(printed["KVM_GUESTDBG_USE_SW_BP"]) == debug.GUESTDBG_USE_SW_BP
    assert int(printed["KVM_GUESTDBG_USE_HW"]) == debug.GUESTDBG_USE_HW
    assert int(printed["KVM_CAP_GUEST_DEBUG_HW_BPS"]) == debug.KVM_CAP_GUEST_DEBUG_HW_BPS
    assert int(printed["KVM_CAP_GUEST_DEBUG_HW_WPS"]) == debug.KVM_CAP_GUEST_DEBUG_HW_WPS


def test_break_at_solo5_app_main_registers_step_memory_and_exit(stub):
    kernel = guest("hello")
    main = symbol(kernel, "solo5_app_main")
    s = stub(kernel)
    c = s.client
    assert b"qXfer:features:read+" in c.ask(b"qSupported:swbreak+")
    xml = c.ask(b"qXfer:features:read:target.xml:0,3fff")
    assert xml.startswith(b"l") and b"<architecture>aarch64</architecture>" in xml
    assert b"org.gnu.gdb.aarch64.core" in xml and b"org.gnu.gdb.aarch64.fpu" in xml
    assert c.ask(b"?").startswith(b"T05")
    # Stopped before the first instruction: pc is the ELF's entry.
    assert u64(c.ask(b"p%x" % PC)) == entry(kernel)
    text = c.ask(b"m%x,4" % main)
    assert c.ask(b"Z0,%x,4" % main) == b"OK"
    assert c.ask(b"m%x,4" % main) == text  # gdb sees the guest's bytes, not brk
    stop = c.ask(b"c")
    assert stop.startswith(b"T05") and b"swbreak" in stop, stop
    regs = c.ask(b"g")
    assert len(regs) == 2 * G_SIZE and b"x" not in regs
    assert c.ask(b"G" + regs) == b"OK"  # written back whole: nothing changes
    assert c.ask(b"g") == regs
    assert u64(c.ask(b"p%x" % PC)) == main
    assert u64(c.ask(b"p%x" % X0)) != 0  # solo5_app_main(si): the start info
    sp = u64(c.ask(b"p%x" % SP))
    assert sp and sp % 16 == 0
    assert u64(c.ask(b"p%x" % CPSR)) & 0xF == 0b0101  # EL1h
    # FP/SIMD registers written and read back through KVM_SET/GET_ONE_REG.
    pattern = bytes(range(1, 17))
    assert c.ask(b"P%x=%s" % (V0 + 7, pattern.hex().encode())) == b"OK"
    assert c.ask(b"p%x" % (V0 + 7)) == pattern.hex().encode()
    assert c.ask(b"P%x=%s" % (FPSR, (0x8000001F).to_bytes(4, "little").hex().encode())) == b"OK"
    assert u64(c.ask(b"p%x" % FPSR)) == 0x8000001F
    # A step over solo5_app_main's first instruction (stp x29, x30,
    # [sp, #-16]!), the breakpoint out of the way as gdb does it.
    assert c.ask(b"z0,%x,4" % main) == b"OK"
    assert c.ask(b"m%x,4" % main) == text  # the guest's own instruction again
    assert c.ask(b"s").startswith(b"T05")
    assert u64(c.ask(b"p%x" % PC)) == main + 4
    assert u64(c.ask(b"p%x" % SP)) == sp - 16
    assert c.ask(b"c") == b"W00"
    out, err, status = s.finish()
    assert "Hello, world" in out, out + err
    assert status == 0, err


def test_a_memory_write_is_what_the_guest_prints(stub):
    kernel = guest("hello")
    s = stub(kernel)
    c = s.client
    image = kernel.read_bytes()
    where = _address_of(image, image.index(b"Hello, world"))  # in the read-only data
    assert bytes.fromhex(c.ask(b"m%x,5" % where).decode()) == b"Hello"
    assert c.ask(b"M%x,5:%s" % (where, b"Howdy".hex().encode())) == b"OK"
    assert c.ask(b"c") == b"W00"
    out, err, status = s.finish()
    assert "Howdy, world" in out, out + err
    assert status == 0, err


def _loads(image: bytes) -> list[tuple[int, int, int]]:
    """(file offset, address, size) of each PT_LOAD."""
    (phoff,) = struct.unpack_from("<Q", image, 32)
    phentsize, phnum = struct.unpack_from("<HH", image, 54)
    out = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", image, phoff + i * phentsize
        )
        if kind == 1:
            out.append((offset, vaddr, filesz))
    return out


def _offset_of(image: bytes, address: int) -> int:
    for offset, vaddr, size in _loads(image):
        if vaddr <= address < vaddr + size:
            return address - vaddr + offset
    raise AssertionError(f"{address:#x} is in no PT_LOAD")


def _address_of(image: bytes, at: int) -> int:
    for offset, vaddr, size in _loads(image):
        if offset <= at < offset + size:
            return at - offset + vaddr
    raise AssertionError(f"file offset {at:#x} is in no PT_LOAD")


def test_hardware_breakpoint_where_kvm_offers_one(stub):
    from pyvmm.arch.aarch64 import debug
    from pyvmm.kvm import System

    with System() as system:
        offered = system.check_extension(debug.KVM_CAP_GUEST_DEBUG_HW_BPS)
    # QEMU's "max" CPU has breakpoint registers and Linux's arm64 KVM
    # offers them: the Z1 path below is the one this machine tests.
    assert offered > 0, "this KVM offers no hardware breakpoints: Z1 is refused there"
    kernel = guest("hello")
    main = symbol(kernel, "solo5_app_main")
    s = stub(kernel)
    c = s.client
    assert c.ask(b"Z1,%x,4" % main) == b"OK"
    assert b"vCont;c;C;s;S" == c.ask(b"vCont?")
    stop = c.ask(b"vCont;c:1")
    assert stop.startswith(b"T05") and b"hwbreak" in stop, stop
    assert u64(c.ask(b"p%x" % PC)) == main
    assert c.ask(b"m%x,4" % main) == _text(kernel, main)  # nothing written
    assert c.ask(b"z1,%x,4" % main) == b"OK"
    assert c.ask(b"c") == b"W00"
    assert s.finish()[2] == 0


def _watch_stub(stub) -> tuple[Stub, int, int, int]:
    """gdbtarget (its start code clears gdb_last with the BSS, twice()
    stores gdb_last = 2 * 41, then loads it back),
    after checking this KVM offers watchpoint registers."""
    from pyvmm.arch.aarch64 import debug
    from pyvmm.kvm import System

    with System() as system:
        offered = system.check_extension(debug.KVM_CAP_GUEST_DEBUG_HW_WPS)
    # QEMU's "max" CPU has watchpoint registers and arm64 KVM offers them.
    assert offered > 0, "this KVM offers no watchpoints: Z2-Z4 get the empty reply there"
    kernel = guest("gdbtarget")
    return stub(kernel), symbol(kernel, "gdb_last"), symbol(kernel, "twice"), offered


def _access(c: RawClient, pc: int) -> str:
    """Whether the instruction at pc is a "store" or a "load" (a 32-bit
    register access with an unsigned offset, STR/LDR Wt, [Xn, #imm], as
    twice() has)."""
    insn = u64(c.ask(b"m%x,4" % pc))
    assert insn & 0xFFC00000 in (0xB9000000, 0xB9400000), hex(insn)
    return "load" if insn & 0x00400000 else "store"


def _gdb_last(c: RawClient, where: int) -> int:
    return int.from_bytes(bytes.fromhex(c.ask(b"m%x,4" % where).decode()), "little")


def test_write_watchpoint_stops_at_the_store_before_it_completes(stub):
    s, last, twice, offered = _watch_stub(stub)
    c = s.client
    # As many as KVM offers, then E (no space); removed again.
    spare = [(twice & ~7) + 8 * i for i in range(offered)]  # text: never written
    for address in spare:
        assert c.ask(b"Z2,%x,8" % address) == b"OK"
    assert c.ask(b"Z2,%x,4" % last) == b"E1c"
    for address in spare:
        assert c.ask(b"z2,%x,8" % address) == b"OK"
    # Lengths and alignments one register pair cannot watch: E, no crash.
    for bad in (b"Z2,%x,3" % last, b"Z2,%x,10" % last, b"Z2,%x,4" % (last + 2), b"Z2,%x,0" % last):
        assert c.ask(bad).startswith(b"E"), bad
    assert c.ask(b"?").startswith(b"T05")
    assert c.ask(b"Z2,%x,4" % last) == b"OK"
    # The first store is the start code's, clearing the BSS; continuing
    # steps over it (the watchpoint left in place) to twice()'s store.
    assert c.ask(b"c") == b"T05thread:01;watch:%x;" % last
    assert entry(s.kernel) <= u64(c.ask(b"p%x" % PC)) < twice
    stop = c.ask(b"c")
    assert stop == b"T05thread:01;watch:%x;" % last, stop
    pc = u64(c.ask(b"p%x" % PC))
    assert twice <= pc < twice + 0x40, (hex(pc), hex(twice))
    assert _access(c, pc) == "store"  # the writing instruction
    assert _gdb_last(c, last) == 0  # stopped before the store
    assert c.ask(b"s") == b"T05thread:01;"  # the step runs the store, no second hit
    assert u64(c.ask(b"p%x" % PC)) == pc + 4
    assert _gdb_last(c, last) == 82
    assert c.ask(b"z2,%x,4" % last) == b"OK"
    assert c.ask(b"c") == b"W01"  # gdb_answer stayed 41
    out, err, status = s.finish()
    assert "gdbtarget: answer 41, doubled 82" in out, out + err
    assert status == 1, err


def test_read_and_access_watchpoints_and_continue_steps_over_the_access(stub):
    s, last, twice, _ = _watch_stub(stub)
    c = s.client
    # A read watchpoint ignores the store: its first stop is the load,
    # with the stored value already there.
    assert c.ask(b"Z3,%x,4" % last) == b"OK"
    stop = c.ask(b"c")
    assert stop == b"T05thread:01;rwatch:%x;" % last, stop
    load = u64(c.ask(b"p%x" % PC))
    assert twice <= load < twice + 0x40 and _access(c, load) == "load"
    assert _gdb_last(c, last) == 82
    assert c.ask(b"z3,%x,4" % last) == b"OK"
    assert c.ask(b"c") == b"W01"
    assert s.finish()[2] == 1
    # An access watchpoint on one byte of it, left in place: the store,
    # then (continue steps over the store and re-arms it) the load.
    s, last, _, _ = _watch_stub(stub)
    c = s.client
    assert c.ask(b"Z0,%x,4" % twice) == b"OK"  # past the start code's BSS clearing
    assert b"swbreak" in c.ask(b"c")
    assert c.ask(b"z0,%x,4" % twice) == b"OK"
    assert c.ask(b"Z4,%x,1" % last) == b"OK"
    assert c.ask(b"c") == b"T05thread:01;awatch:%x;" % last
    store = u64(c.ask(b"p%x" % PC))
    assert _access(c, store) == "store" and _gdb_last(c, last) == 0
    assert c.ask(b"c") == b"T05thread:01;awatch:%x;" % last
    assert u64(c.ask(b"p%x" % PC)) == load != store
    assert c.ask(b"c") == b"W01"  # nothing else touches gdb_last
    out, err, status = s.finish()
    assert "doubled 82" in out and status == 1, out + err


def _text(kernel: Path, address: int) -> bytes:
    image = kernel.read_bytes()
    return image[_offset_of(image, address) :][:4].hex().encode()


def test_ctrl_c_stops_a_spinning_guest(stub):
    s = stub(guest("spin"))
    c = s.client
    assert c.ask(b"?").startswith(b"T05")
    c.send(c.packet(b"c"))
    assert c.ack() == b"+"
    assert s.pyvmm.stdout.readline() == "spinning\n"
    c.send(b"\x03")
    assert c.reply(acked=False).startswith(b"T02")
    spin = symbol(guest("spin"), "solo5_app_main")
    assert 0 <= u64(c.ask(b"p%x" % PC)) - spin < 0x1000  # in the guest's loop
    c.send(c.packet(b"k"))  # kill: no reply, the run ends as SIGKILL would end it
    assert s.finish()[2] == 137


def test_faulting_guest_stops_at_the_faulting_instruction(stub):
    s = stub(guest("fault_zeropage"))
    c = s.client
    assert c.ask(b"?").startswith(b"T05")
    assert c.ask(b"c").startswith(b"T0b")  # SIGSEGV
    pc = u64(c.ask(b"p%x" % PC))
    assert c.ask(b"c") == b"X0b"
    out, err, status = s.finish()
    assert status == 1, err
    fault = FAULT_PC.search(err)
    assert fault and int(fault.group(1), 16) == pc, err
    assert "solo5_app_main" in err, err


# -- cores -------------------------------------------------------------------------
def notes(core: bytes) -> tuple[int, dict[int, bytes], list[tuple]]:
    """e_machine, the notes by type, the program headers."""
    assert core[:4] == b"\x7fELF"
    e_type, e_machine = struct.unpack_from("<HH", core, 16)
    assert e_type == 4  # ET_CORE
    phoff = struct.unpack_from("<Q", core, 32)[0]
    phnum = struct.unpack_from("<H", core, 56)[0]
    headers = [struct.unpack_from("<IIQQQQQQ", core, phoff + 56 * i) for i in range(phnum)]
    found: dict[int, bytes] = {}
    for kind, _, offset, _, _, size, _, _ in headers:
        if kind != 4:  # PT_NOTE
            continue
        at = offset
        while at < offset + size:
            namesz, descsz, ntype = struct.unpack_from("<III", core, at)
            desc = at + 12 + -(-namesz // 4) * 4
            assert core[at + 12 : at + 16] == b"CORE"
            found[ntype] = core[desc : desc + descsz]
            at = desc + -(-descsz // 4) * 4
    return e_machine, found, headers


def core_named(result: subprocess.CompletedProcess) -> Path:
    names = re.findall(r"dumping guest core to: (\S+)$", result.stderr, re.M)
    assert len(names) == 1, result.stderr
    return Path(names[0])


def test_fault_core_is_aarch64_with_the_faulting_pc(tmp_path):
    kernel = guest("fault_zeropage")
    result = run_pyvmm("--mem=8", f"--dumpcore={tmp_path}", kernel, timeout=TIMEOUT)
    assert result.returncode == 1, result.stderr
    core = core_named(result).read_bytes()
    machine, found, headers = notes(core)
    assert machine == 183  # EM_AARCH64
    prstatus = found[1]
    assert len(prstatus) == 392  # Linux's aarch64 struct elf_prstatus
    assert struct.unpack_from("<h", prstatus, 12)[0] == 11  # pr_cursig: SIGSEGV
    regs = struct.unpack_from("<34Q", prstatus, 112)  # user_pt_regs: x0-x30, sp, pc, pstate
    fault_pc = int(FAULT_PC.search(result.stderr).group(1), 16)
    assert regs[32] == fault_pc, (hex(regs[32]), result.stderr)
    assert regs[33] & 0xF == 0b0101  # the guest's own PSTATE (EL1h), not the vector's
    assert struct.unpack_from("<i", prstatus, 112 + 272)[0] == 1  # pr_fpvalid
    assert len(found[2]) == 528  # NT_PRFPREG: user_fpsimd_state
    loads = [h for h in headers if h[0] == 1]
    assert len(loads) == 1 and loads[0][3] == 0 and loads[0][5] == 8 << 20
    # The faulting instruction is in the core, at its address: the guest's text.
    text = core[loads[0][2] + fault_pc : loads[0][2] + fault_pc + 4]
    image = kernel.read_bytes()
    assert text == image[_offset_of(image, fault_pc) :][:4]


def test_abort_core_says_sigabrt(tmp_path):
    result = run_pyvmm(f"--dumpcore={tmp_path}", guest("abort"), timeout=TIMEOUT)
    assert result.returncode == 255, result.stderr
    machine, found, _ = notes(core_named(result).read_bytes())
    assert machine == 183
    assert struct.unpack_from("<h", found[1], 12)[0] == 6  # SIGABRT


def test_detach_removes_breakpoints_and_the_guest_runs_on(stub):
    kernel = guest("hello")
    main = symbol(kernel, "solo5_app_main")
    s = stub(kernel)
    c = s.client
    assert c.ask(b"Z0,%x,4" % main) == b"OK"
    assert c.ask(b"c").startswith(b"T05")
    assert c.ask(b"Z0,%x,4" % symbol(kernel, "rt_puts")) == b"OK"  # never hit: removed
    assert c.ask(b"D") == b"OK"
    out, err, status = s.finish()
    assert "pyvmm: gdb: detached; the guest runs on" in err, err
    assert "Hello, world" in out and status == 0, out + err

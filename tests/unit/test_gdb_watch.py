"""arm64 watchpoints for the GDB stub, on any host: the DBGWCR/DBGWVR
encoding, the syndrome's classes, the Z2-Z4 answers and the step over an
access a watchpoint stopped (KVM itself: tests/aarch64/test_aarch64_debug.py)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from pyvmm.arch.aarch64 import debug
from pyvmm.vm.debug import gdbstub

GDB_LAST = 0x103008


def test_watch_registers_select_the_bytes_and_the_access():
    wcr, wvr = debug.watch_registers(2, GDB_LAST, 4)
    assert wvr == GDB_LAST
    assert wcr & 1 and (wcr >> 1) & 3 == 0b11  # enabled, EL1 and EL0
    assert (wcr >> 3) & 3 == 0b10 and (wcr >> 5) & 0xFF == 0x0F  # stores, bytes 0-3
    wcr, wvr = debug.watch_registers(3, GDB_LAST + 4, 4)
    assert wvr == GDB_LAST and (wcr >> 3) & 3 == 0b01 and (wcr >> 5) & 0xFF == 0xF0
    wcr, wvr = debug.watch_registers(4, GDB_LAST + 3, 1)
    assert wvr == GDB_LAST and (wcr >> 3) & 3 == 0b11 and (wcr >> 5) & 0xFF == 0x08
    assert (debug.watch_registers(2, GDB_LAST + 6, 2)[0] >> 5) & 0xFF == 0xC0
    assert (debug.watch_registers(2, GDB_LAST, 8)[0] >> 5) & 0xFF == 0xFF
    assert debug.watch_registers(2, GDB_LAST, 8)[0] >> 13 == 0  # no mask, no linking


@pytest.mark.parametrize(
    "kind, address, length",
    [(2, GDB_LAST, 3), (2, GDB_LAST, 16), (2, GDB_LAST, 0), (2, GDB_LAST + 2, 4),
     (3, GDB_LAST + 4, 8), (4, GDB_LAST + 1, 2), (1, GDB_LAST, 4), (2, 1 << 64, 1)],
)  # fmt: skip
def test_watch_registers_refuse_what_one_pair_cannot_watch(kind, address, length):
    with pytest.raises(ValueError):
        debug.watch_registers(kind, address, length)


def test_guest_debug_puts_watchpoints_in_dbg_wcr_and_dbg_wvr():
    raw = debug.guest_debug(step=False, software=False, watchpoints=((2, GDB_LAST, 4),))
    fields = struct.unpack("<II64Q", raw)
    control, regs = fields[0], fields[2:]
    assert control == debug.GUESTDBG_ENABLE | debug.GUESTDBG_USE_HW
    bcr, bvr, wcr, wvr = (regs[i * 16 : (i + 1) * 16] for i in range(4))
    assert not any(bcr) and not any(bvr)
    assert (wcr[0], wvr[0]) == debug.watch_registers(2, GDB_LAST, 4) and not any(wcr[1:])
    assert debug.guest_debug(step=False, software=False) == bytes(len(raw))  # all off


def test_exception_classes_of_a_debug_exit():
    assert debug.exception_class(0xD0000000) == 0x34  # a watchpoint from EL1
    assert debug.exception_class(0xF2000000) == debug.EC_BRK
    assert debug.exception_class(0xCA000022) in debug.EC_STEP
    assert debug.exception_class(0xC2000000) in debug.EC_HW_BREAK


def test_watch_hit_names_the_watchpoint_accessed():
    watches = [(2, 0x2000, 8), (4, GDB_LAST, 4)]
    assert debug.watch_hit(GDB_LAST + 2, watches) == (4, GDB_LAST, 4)
    assert debug.watch_hit(0x2007, watches) == (2, 0x2000, 8)
    assert debug.watch_hit(GDB_LAST - 8, watches) == (4, GDB_LAST, 4)  # a pair store below
    assert debug.watch_hit(GDB_LAST, []) is None


class _Stub(gdbstub.GdbStub):
    """The stub's aarch64 logic without a KVM or a socket: the debug state
    it would give KVM and the stops it would send are recorded."""

    def __init__(self, watch_slots: int) -> None:
        self.vcpu, self.target = None, None
        self.conn = object()
        self.watch_slots, self.watchpoints, self.over_watch = watch_slots, {}, False
        self.hardware, self.breakpoints, self.hw_slots = {}, {}, 0
        self.software, self.deprivileged, self.stepping = True, False, False
        self._debug_state, self._wake_fd = None, -1
        self.armed: list[dict] = []
        self.stops: list[bytes] = []

    def _stop(self, view, reply: bytes, final: bool = False, send: bool = True) -> None:
        self.stops.append(reply)


@pytest.fixture
def aarch64(monkeypatch):
    def record(vcpu, **state):
        stub.armed.append(state)

    monkeypatch.setattr(gdbstub, "AARCH64", True)
    monkeypatch.setattr(gdbstub, "a64debug", debug, raising=False)
    monkeypatch.setattr(debug, "set_guest_debug", record)
    monkeypatch.setattr(gdbstub, "Aarch64View", lambda vcpu: SimpleNamespace(read=dict))
    stub = _Stub(watch_slots=2)
    return stub


def _exit(ec: int, far: int = 0) -> SimpleNamespace:
    return SimpleNamespace(hsr=ec << 26 | 1 << 25, far=far)


def test_z2_to_z4_answers(aarch64):
    stub = aarch64
    assert stub.answer(b"Z2,%x,3" % GDB_LAST, None) == b"E01"
    assert stub.answer(b"Z3,%x,4" % (GDB_LAST + 1), None) == b"E01"
    assert stub.answer(b"Z2,%x,4" % GDB_LAST, None) == b"OK"
    assert stub.answer(b"Z4,%x,8" % GDB_LAST, None) == b"OK"
    assert stub.answer(b"Z3,%x,1" % GDB_LAST, None) == b"E1c"  # two registers here
    assert stub.answer(b"z4,%x,8" % GDB_LAST, None) == b"OK"
    assert stub.answer(b"z4,%x,8" % GDB_LAST, None) == b"OK"  # gone already: fine
    assert list(stub.watchpoints) == [(2, GDB_LAST, 4)]
    stub.watch_slots = 0  # KVM without watchpoint registers, and x86_64
    assert stub.answer(b"Z2,%x,4" % GDB_LAST, None) == b""


def test_a_watchpoint_stop_is_stepped_over_on_continue(aarch64):
    stub = aarch64
    assert stub.answer(b"Z2,%x,4" % GDB_LAST, None) == b"OK"
    stub._resume(None, step=False)
    assert stub.armed[-1]["watchpoints"] == ((2, GDB_LAST, 4),) and not stub.armed[-1]["step"]
    assert stub.debug_exit(_exit(0x34, GDB_LAST))
    assert stub.stops == [b"T05thread:01;watch:%x;" % GDB_LAST]
    stub._resume(None, step=False)  # continue: one step with the watchpoint off
    assert stub.armed[-1]["step"] and stub.armed[-1]["watchpoints"] == ()
    assert stub.debug_exit(_exit(0x32))  # the step done: no stop, the watchpoint back
    assert len(stub.stops) == 1
    assert stub.armed[-1] == {
        "step": False,
        "software": False,
        "breakpoints": (),
        "watchpoints": ((2, GDB_LAST, 4),),
    }
    assert not stub.debug_exit(_exit(0x32))  # a step nobody asked for is not the stub's


def test_a_step_from_a_watchpoint_stop_stops_after_the_access(aarch64):
    stub = aarch64
    assert stub.answer(b"Z3,%x,4" % GDB_LAST, None) == b"OK"
    assert stub.debug_exit(_exit(0x34, GDB_LAST + 2))
    assert stub.stops[-1] == b"T05thread:01;rwatch:%x;" % GDB_LAST
    stub._resume(None, step=True)
    assert stub.armed[-1]["step"] and stub.armed[-1]["watchpoints"] == ()
    assert stub.debug_exit(_exit(0x32))
    assert stub.stops[-1] == b"T05thread:01;"
    stub._resume(None, step=False)
    assert stub.armed[-1]["watchpoints"] == ((3, GDB_LAST, 4),) and not stub.armed[-1]["step"]

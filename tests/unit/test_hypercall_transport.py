"""Which exit is an hvt hypercall is decoded once, in C (csrc/hctransport.h),
for the fast path and for Python's Arch.hypercall alike: one 4-byte `outl`
to port 0x500 + n on x86_64, one 32-bit store to the MMIO window + 8n on
aarch64, n in 1..HVT_HYPERCALL_MAX or the number reserved for pyvmm's
tests. A string write (`rep outsl`, KVM's
count > 1), another width or another number is no hypercall, and the
fault line for a write to the hypercall ports names the number only when
the write had the transport's shape."""

from __future__ import annotations

import pytest

from pyvmm._native import lib
from pyvmm.arch.aarch64 import ARCH as AARCH64
from pyvmm.arch.x86_64 import ARCH as X86_64
from pyvmm.arch.x86_64 import faults
from pyvmm.kvm import IoOut, Mmio, System

PIO = lib.HVT_HYPERCALL_PIO_BASE
MMIO = lib.HVT_HYPERCALL_MMIO_BASE
MAX = lib.HVT_HYPERCALL_MAX
GPA = 0x12340


@pytest.mark.parametrize("number", range(1, MAX + 1))
def test_one_outl_to_a_hypercall_port_is_that_hypercall(number):
    assert X86_64.hypercall(IoOut(PIO + number, 4, GPA, 1)) == (number, GPA)
    assert X86_64.hypercall(IoOut(PIO + number, 4, GPA)) == (number, GPA)  # count 1 by default


@pytest.mark.parametrize("count", [0, 2, 3, 1024])
def test_a_string_write_to_a_hypercall_port_is_no_hypercall(count):
    """`rep outsl` with count > 1 (the C fast path always refused it)."""
    assert X86_64.hypercall(IoOut(PIO + lib.HVT_HYPERCALL_PUTS, 4, GPA, count)) is None


@pytest.mark.parametrize("size", [1, 2, 8])
def test_another_width_is_no_hypercall(size):
    assert X86_64.hypercall(IoOut(PIO + lib.HVT_HYPERCALL_WALLTIME, size, GPA)) is None


@pytest.mark.parametrize("port", [0, PIO - 1, PIO, PIO + MAX + 1, 0x600, 0xFFFF])
def test_a_port_outside_the_hypercalls_is_no_hypercall(port):
    assert X86_64.hypercall(IoOut(port, 4, GPA)) is None


def test_an_mmio_exit_is_no_x86_hypercall_and_a_port_write_no_aarch64_one():
    assert X86_64.hypercall(Mmio(MMIO + 8 * 2, 4, True, GPA)) is None
    assert AARCH64.hypercall(IoOut(PIO + 2, 4, GPA)) is None


@pytest.mark.parametrize(
    "args, slot",
    [
        ((4, 1, PIO), 0),
        ((4, 1, PIO + 3), 3),
        ((4, 1, PIO + MAX), MAX),
        ((4, 1, PIO + MAX + 1), -1),
        ((4, 1, PIO + lib.HVT_HYPERCALL_PYVMM_TEST), -1),
        ((4, 2, PIO + 3), -1),
        ((2, 1, PIO + 3), -1),
        ((4, 1, PIO - 1), -1),
    ],
)
def test_the_hypercall_slot_of_a_port_write(args, slot):
    """The slot is what a fault line names; 0 and numbers pyvmm does not
    answer are guest errors, not the transport's."""
    assert lib.pyvmm_hypercall_pio_slot(*args) == slot
    assert lib.pyvmm_hypercall_pio(*args) == max(slot, 0)


@pytest.mark.parametrize(
    "args, number",
    [
        ((True, 4, MMIO + 8 * 2), 2),
        ((True, 4, MMIO + 8 * MAX), MAX),
        ((True, 4, MMIO), 0),
        ((True, 4, MMIO + 8 * (MAX + 1)), 0),
        ((True, 4, MMIO + 8 * lib.HVT_HYPERCALL_PYVMM_TEST), 0),
        ((True, 4, MMIO + 8 * 2 + 4), 0),
        ((True, 8, MMIO + 8 * 2), 0),
        ((False, 4, MMIO + 8 * 2), 0),
        ((True, 4, MMIO - 8), 0),
    ],
)
def test_the_mmio_transport_is_decoded_the_same_from_python(args, number):
    assert lib.pyvmm_hypercall_mmio(*args) == number
    expected = (number, GPA) if number else None
    assert AARCH64.hypercall(Mmio(args[2], args[1], args[0], GPA)) == expected


@pytest.mark.parametrize(
    "args, slot",
    [
        ((4, MMIO + 8 * 2), 2),
        ((4, MMIO + 8), 1),
        ((4, MMIO), 0),
        ((4, MMIO + 8 * MAX), MAX),
        ((4, MMIO + 8 * (MAX + 1)), -1),
        ((4, MMIO + 8 * 2 + 4), -1),
        ((4, MMIO + 1), -1),
        ((8, MMIO + 8 * 2), -1),
        ((4, MMIO - 8), -1),
    ],
)
def test_the_hypercall_slot_of_an_mmio_store(args, slot):
    """As for a port: a store to slot 0 has the transport's shape (a guest
    error the fault line names); a misaligned or unknown one has none."""
    assert lib.pyvmm_hypercall_mmio_slot(*args) == slot
    assert lib.pyvmm_hypercall_mmio(True, *args) == max(slot, 0)


@pytest.fixture
def answered_test_number():
    """As while a run's table has the test-only kind's hypercall."""
    assert lib.pyvmm_hypercall_set_extra(1 << lib.HVT_HYPERCALL_PYVMM_TEST) == 0
    yield lib.HVT_HYPERCALL_PYVMM_TEST
    lib.pyvmm_hypercall_set_extra(0)


def test_a_number_past_solo5s_is_a_slot_only_while_a_kind_answers_it(answered_test_number):
    n = answered_test_number
    assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + n) == n
    assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + n - 1) == -1
    assert lib.pyvmm_hypercall_mmio(True, 4, MMIO + 8 * n) == n
    assert X86_64.hypercall(IoOut(PIO + n, 4, GPA)) == (n, GPA)
    lib.pyvmm_hypercall_set_extra(0)
    assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + n) == -1
    assert X86_64.hypercall(IoOut(PIO + n, 4, GPA)) is None


def test_the_last_number_a_kind_may_claim_is_63():
    """Extras are bits of one 64-bit word: 63 is the last; none is past it."""
    try:
        assert lib.pyvmm_hypercall_set_extra(1 << 63) == 0
        assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + 63) == 63
        assert lib.pyvmm_hypercall_mmio_slot(4, MMIO + 8 * 63) == 63
        assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + 64) == -1
    finally:
        lib.pyvmm_hypercall_set_extra(0)


def test_solo5s_own_numbers_cannot_be_claimed_as_extra():
    assert lib.pyvmm_hypercall_set_extra(1 << lib.HVT_HYPERCALL_NET_READ) == -1
    assert lib.pyvmm_hypercall_set_extra(1 | 1 << 20) == -1
    assert lib.pyvmm_hypercall_pio_slot(4, 1, PIO + 20) == -1


@pytest.fixture
def vcpu():
    with System() as kvm, kvm.create_vm() as vm:
        yield vm.create_vcpu(0)


@pytest.mark.kvm
@pytest.mark.parametrize("number", [0, 1, MAX - 1, MAX])
def test_a_hypercall_pyvmm_does_not_answer_is_named_by_its_number(vcpu, number):
    fault = faults.explain(IoOut(PIO + number, 4, GPA), vcpu, None)
    assert f"4-byte write to port {PIO + number:#x} (Invalid guest hypercall: num={number})" in str(
        fault
    )


@pytest.mark.kvm
@pytest.mark.parametrize(
    "exit, size",
    [
        (IoOut(PIO + 2, 4, GPA, 2), 4),
        (IoOut(PIO + 2, 2, GPA), 2),
        (IoOut(PIO + MAX + 1, 4, GPA), 4),
    ],
)
def test_a_write_without_the_transports_shape_is_a_port_access(vcpu, exit, size):
    fault = str(faults.explain(exit, vcpu, None))
    assert f"invalid hypercall: {size}-byte write to port {exit.port:#x} " in fault
    assert f"(Invalid guest port access: port={exit.port:#x})" in fault
    assert "num=" not in fault


#: The doorbells, by their x86 port, and the MMIO address each has on aarch64.
DOORBELLS = {
    lib.HVT_RING_KICK_PIO: lib.HVT_RING_KICK_MMIO,
    lib.SHM_KICK_PIO: lib.SHM_KICK_MMIO,
    lib.PYVMM_NULL_KICK_PIO: lib.PYVMM_NULL_KICK_MMIO,
}


@pytest.mark.parametrize("port", sorted(DOORBELLS))
def test_a_doorbell_is_one_outl_to_its_port_or_one_store_to_its_address(port):
    assert X86_64.doorbell(IoOut(port, 4, 1)) == port
    assert AARCH64.doorbell(Mmio(DOORBELLS[port], 4, True, 1)) == port
    assert lib.pyvmm_doorbell_pio(4, 1, port) == port
    assert lib.pyvmm_doorbell_mmio(1, 4, DOORBELLS[port]) == port


@pytest.mark.parametrize("port", sorted(DOORBELLS))
def test_another_shape_rings_no_doorbell(port):
    for size in (1, 2, 8):
        assert lib.pyvmm_doorbell_pio(size, 1, port) == 0
        assert lib.pyvmm_doorbell_mmio(1, size, DOORBELLS[port]) == 0
    for count in (0, 2):  # `rep outsl`
        assert lib.pyvmm_doorbell_pio(4, count, port) == 0
    assert lib.pyvmm_doorbell_mmio(0, 4, DOORBELLS[port]) == 0  # a load
    assert X86_64.doorbell(Mmio(DOORBELLS[port], 4, True, 1)) == 0
    assert AARCH64.doorbell(IoOut(port, 4, 1)) == 0


@pytest.mark.parametrize("port", [0, PIO + 1, 0x5FF, 0x601, 0x60F, 0x611, 0x6FE, 0x700])
def test_other_ports_and_addresses_ring_none(port):
    assert lib.pyvmm_doorbell_pio(4, 1, port) == 0
    for addr in (MMIO + 8, lib.HVT_RING_KICK_MMIO + 4, lib.SHM_KICK_MMIO - 4, 0):
        assert lib.pyvmm_doorbell_mmio(1, 4, addr) == 0

"""The guest's shmstream driver (guests/runtime/net_shm.c, built for the host
by testkit/guestnet_build.py) against a broken or hostile host: the test is
the host, writing the boot extension, the region and the rings itself.

tests/test_shmstream.py runs the driver in real guests against pyvmm's
host, which never breaks the protocol; here every check the driver makes
of the host is made to fire, and the kick, the clock and the console are
test doubles (testkit/guestrt/doubles.c)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from testkit.guestnet import M32, PAGE, Host, ffi, lib, ring_bytes

OK, AGAIN, EINVAL, EUNSPEC = (
    lib.SOLO5_R_OK,
    lib.SOLO5_R_AGAIN,
    lib.SOLO5_R_EINVAL,
    lib.SOLO5_R_EUNSPEC,
)
DATA = lib.SHM_SLOT_DATA
STEP_NS = 1  # the fake clock's advance per read: fine enough to tell 20000 ns from 20020
TX_WAIT_NS = 100_000_000  # net_shm.c: solo5_net_write's wait for space
TX_DRAIN_NS = 1_000_000_000  # net_shm.c: pyvmm_net_tx_wait's wait
WAIT_SPIN_NS, WAIT_SLEEP_NS = 20_000, 50_000  # net_shm.c: spin, then poll this long
WATCHDOG_S = 20  # a test of a few ms that takes this long is a driver loop that never ends
REJECTED = "pyvmm-rt: shmstream region rejected ({}): using hypercalls\n"


@pytest.fixture
def make_host() -> Iterator[Callable[..., Host]]:
    """A fresh driver (its statics and every double zeroed), and hosts
    made for it, unmapped afterwards."""
    assert lib.gh_reset() == 0, "cannot map the boot extension's page at its GPA"
    lib.gh_clock_step = STEP_NS
    assert lib.gh_watchdog(WATCHDOG_S) == 0
    hosts: list[Host] = []

    def make(*args, **kwargs) -> Host:
        host = Host(*args, **kwargs)
        hosts.append(host)
        return host

    yield make
    lib.gh_watchdog(0)
    for host in hosts:
        host.close()
    lib.gh_reset()


@pytest.fixture
def host(make_host) -> Host:
    """One device, handle 1, 8 slots, probed: it uses the rings."""
    host = make_host()
    assert lib.gh_probe(1) == 1
    return host


def console() -> str:
    return ffi.string(lib.gh_console()).decode()


def stats(h: int = 1) -> dict[str, int]:
    out = ffi.new("struct pyvmm_net_stats *")
    lib.gh_stats(h, out)
    return {name: getattr(out, name) for name, _ in ffi.typeof(out[0]).fields}


def read(h: int = 1, size: int = DATA) -> tuple[int, bytes]:
    buf = ffi.new("uint8_t[]", size + 16)
    got = ffi.new("size_t *", 12345)
    r = lib.gh_read(h, buf, size, got)
    return r, bytes(ffi.buffer(buf, got[0])) if r == OK else b""


def read_zc(h: int = 1) -> tuple[int, object, bytes]:
    frame = ffi.new("uint8_t **")
    length = ffi.new("size_t *")
    r = lib.gh_read_zc(h, frame, length)
    data = bytes(ffi.buffer(frame[0], length[0])) if r == OK else b""
    return r, frame[0], data


def queue(frame: bytes, h: int = 1) -> int:
    return lib.gh_queue(h, frame, len(frame))


def write(frame: bytes, h: int = 1) -> int:
    return lib.gh_write(h, frame, len(frame))


def addr(p) -> int:
    return int(ffi.cast("uintptr_t", p))


def frame(i: int, n: int = 64) -> bytes:
    return bytes((i + k) & 0xFF for k in range(n))


# ---- probing and the region's validation -----------------------------------


def test_a_good_region_serves_its_device_through_the_rings(make_host):
    host = make_host()
    host.rx(1).cons_sleeping = 1  # left over: the probe says the guest is awake
    assert lib.gh_probe(1) == 1
    assert console() == ""
    assert ffi.string(lib.gh_driver_name()) == b"shmstream"
    assert lib.gh_driver_shm() == 1
    assert lib.gh_yield_served() == 1 << 1 and lib.gh_yield_others() == 0
    assert host.rx(1).cons_sleeping == 0
    assert lib.gh_other_hypercalls == 0 and lib.gh_kicks == 0
    assert stats() == dict.fromkeys(stats(), 0)


def test_the_driver_starts_from_the_indices_the_rings_hold(make_host):
    """A resumed guest (a snapshot's indices), just before the wrap."""
    host = make_host()
    start = M32 - 1
    for ring in (host.rx(1), host.tx(1)):
        ring.prod = ring.cons = start
    assert lib.gh_probe(1) == 1
    frames = [frame(i) for i in range(3)]
    host.send(1, *frames)
    assert [read() for _ in frames] == [(OK, f) for f in frames]
    assert host.rx(1).cons == (start + 3) & M32
    for f in frames:
        assert write(f) == OK
    assert host.tx(1).prod == (start + 3) & M32
    assert host.take(1) == frames


def test_a_stock_hvt_host_has_no_boot_extension(make_host):
    make_host()
    lib.gh_boot_info().host_features = lib.PYVMM_FEATURE_BOOT_EXT - 1  # all but that bit
    assert lib.gh_probe(1) == 0
    assert console() == ""
    assert lib.gh_yield_set_calls == 0


def test_shm_off_offers_no_region(make_host):
    host = make_host()
    host.ext.shm_region = 0
    assert lib.gh_probe(1) == 0
    assert console() == ""


def test_a_device_the_region_does_not_list_keeps_the_hypercalls(make_host):
    make_host(handles=(1,), manifest={2: lib.MFT_DEV_NET_BASIC})
    assert lib.gh_probe(2) == 0
    assert console() == ""
    assert lib.gh_probe(1) == 1
    assert lib.gh_yield_served() == 1 << 1
    assert lib.gh_yield_others() == 1 << 2


def test_a_handle_past_the_manifest_table_is_refused(make_host):
    make_host()
    assert lib.gh_probe(1) == 1
    assert lib.gh_probe(lib.MFT_MAX_ENTRIES) == 0
    assert lib.gh_yield_others() == 0 and lib.gh_yield_served() == 1 << 1


@pytest.mark.parametrize(
    ("mtu", "served"),
    [(DATA - lib.SOLO5_NET_HLEN, True), (DATA - lib.SOLO5_NET_HLEN + 1, False)],
)
def test_a_device_whose_frames_do_not_fit_a_slot_keeps_the_hypercalls(make_host, mtu, served):
    make_host(mtu=mtu)
    assert lib.gh_probe(1) == int(served)
    if served:
        assert console() == ""
    else:
        assert console() == (
            "pyvmm-rt: net device 1: MTU too large for shmstream slots: using hypercalls\n"
        )
        assert lib.gh_yield_set_calls == 0


def shift_ring(host: Host, which: str, by: int, dev: int = 0) -> None:
    """Move device ``dev``'s ring ``which`` by ``by`` bytes, with a good
    ring header where it now is (if that is inside the region)."""
    d = host.region.dev[dev]
    setattr(d, which, getattr(d, which) + by)
    gpa = getattr(d, which)
    if host.base + lib.SHM_REGION_HEADER_SIZE <= gpa and gpa + 192 <= host.base + host.mapped:
        ring = ffi.cast("struct shm_ring *", gpa)
        ring.slots, ring.slot_size = host.slots, lib.SHM_SLOT_SIZE


def net_entry(h: int) -> None:
    lib.gh_manifest().e[h].type = lib.MFT_DEV_NET_BASIC


# (what breaks the host's set-up, the reason the guest prints)
BROKEN: dict[str, tuple[Callable[[Host], None], str]] = {
    "ext_version": (lambda h: setattr(h.ext, "version", 2), "boot extension version is not 1"),
    "base_unaligned": (
        lambda h: setattr(h.ext, "shm_region", h.base + 64),
        "bad region address or size",
    ),
    "header_only": (
        lambda h: (
            setattr(h.ext, "shm_size", lib.SHM_REGION_HEADER_SIZE),
            setattr(h.region, "size", lib.SHM_REGION_HEADER_SIZE),
        ),
        "ring outside the region",
    ),
    "size_below_header": (
        lambda h: setattr(h.ext, "shm_size", lib.SHM_REGION_HEADER_SIZE - 1),
        "bad region address or size",
    ),
    "size_past_4g": (
        lambda h: setattr(h.ext, "shm_size", (1 << 32) + PAGE),
        "bad region address or size",
    ),
    "end_past_4g": (
        lambda h: setattr(h.ext, "shm_size", (1 << 32) - h.base + PAGE),
        "bad region address or size",
    ),
    "over_usable_memory": (
        lambda h: setattr(lib.gh_boot_info(), "mem_size", h.base + 1),
        "region overlaps usable memory",
    ),
    "magic": (lambda h: setattr(h.region, "magic", lib.SHM_MAGIC + 1), "bad magic"),
    "version": (lambda h: setattr(h.region, "version", 2), "unknown version"),
    "no_device": (lambda h: setattr(h.region, "ndevices", 0), "bad device count"),
    "17_devices": (
        lambda h: setattr(h.region, "ndevices", lib.SHM_MAX_DEVICES + 1),
        "bad device count",
    ),
    "no_slot": (lambda h: setattr(h.region, "slots", 0), "slots is not a power of two"),
    "6_slots": (lambda h: setattr(h.region, "slots", 6), "slots is not a power of two"),
    "3_slots": (lambda h: setattr(h.region, "slots", 3), "slots is not a power of two"),
    "too_many_slots": (
        lambda h: setattr(h.region, "slots", 1 << 17),
        "slots is not a power of two",
    ),
    "region_size": (
        lambda h: setattr(h.region, "size", h.size + PAGE),
        "region size differs from the boot extension",
    ),
    # Entry 0 and the entry past the last made to look like net devices:
    # the handle's bounds alone must refuse them.
    "handle_0": (
        lambda h: (net_entry(0), setattr(h.region.dev[0], "handle", 0)),
        "device handle is not a net device",
    ),
    "handle_past_manifest": (
        lambda h: (net_entry(2), setattr(h.region.dev[0], "handle", 2)),
        "device handle is not a net device",
    ),
    "ring_unaligned": (lambda h: shift_ring(h, "tx", 8), "ring not cache-line aligned"),
    "ring_in_header": (
        lambda h: shift_ring(h, "rx", -lib.SHM_CACHE_LINE),
        "ring outside the region",
    ),
    "ring_past_end": (
        lambda h: shift_ring(h, "tx", h.size + PAGE),
        "ring outside the region",
    ),
    "ring_below_region": (
        lambda h: setattr(h.region.dev[0], "rx", h.base - 2 * PAGE),
        "ring outside the region",
    ),
    "ring_ends_past_end": (
        lambda h: shift_ring(h, "tx", h.size - lib.SHM_REGION_HEADER_SIZE - 2 * h.ring_size + 64),
        "ring outside the region",
    ),
    "ring_slots": (
        lambda h: setattr(h.rx(1), "slots", h.slots // 2),
        "ring header disagrees with the region header",
    ),
    "ring_slot_size": (
        lambda h: setattr(h.tx(1), "slot_size", lib.SHM_SLOT_SIZE // 2),
        "ring header disagrees with the region header",
    ),
    "rx_is_tx": (lambda h: shift_ring(h, "tx", -h.ring_size), "rings overlap"),
    "tx_overlaps_rx": (lambda h: shift_ring(h, "tx", -64), "rings overlap"),
    "rx_overlaps_tx": (lambda h: shift_ring(h, "rx", h.ring_size - 64), "rings overlap"),
}


def roomy(make_host) -> Host:
    """One device, with room in the region past its rings to move them."""
    need = lib.SHM_REGION_HEADER_SIZE + 4 * ring_bytes(8)
    return make_host(slots=8, size=-(-need // PAGE) * PAGE + PAGE)


def test_the_roomy_layout_is_good(make_host):
    host = roomy(make_host)
    assert lib.gh_probe(1) == 1 and console() == ""
    host.send(1, b"in")
    assert read() == (OK, b"in")


def test_rings_in_the_other_order_are_good(make_host):
    """TX first, RX right after it: adjacent, not overlapping."""
    host = make_host()
    dev = host.region.dev[0]
    dev.rx, dev.tx = dev.tx, dev.rx
    assert lib.gh_probe(1) == 1 and console() == ""


@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_region_is_rejected_with_its_reason(make_host, broken):
    host = roomy(make_host)
    breaks, why = BROKEN[broken]
    breaks(host)
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format(why)
    assert lib.gh_yield_set_calls == 0 and lib.gh_yield_served() == 0
    # Decided once: another device is not looked for in a rejected region.
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format(why)


def test_a_block_device_handle_is_not_a_net_device(make_host):
    make_host(handles=(1,), manifest={1: lib.MFT_DEV_BLOCK_BASIC})
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format("device handle is not a net device")


def test_bad_boot_extension_magic_is_rejected(make_host):
    host = make_host()
    host.ext.magic = lib.PYVMM_BOOT_EXT_MAGIC ^ 1
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format("bad boot extension magic")


def test_the_limits_themselves_are_accepted(make_host):
    """Each bound at its edge: a region exactly as large as its rings,
    right at mem_size, with a ring of one slot and 16 devices."""
    handles = tuple(range(1, lib.SHM_MAX_DEVICES + 1))
    host = make_host(handles=handles, slots=1)
    exact = lib.SHM_REGION_HEADER_SIZE + 2 * len(handles) * host.ring_size
    host.ext.shm_size = host.region.size = exact
    assert lib.gh_probe(16) == 1 and console() == ""
    host.send(16, b"last")
    assert read(16) == (OK, b"last")
    assert write(b"out", h=16) == OK
    assert host.take(16) == [b"out"]


def test_the_largest_ring_is_accepted(make_host):
    host = make_host(slots=65536)
    assert lib.gh_probe(1) == 1 and console() == ""
    host.send(1, b"big ring")
    assert read() == (OK, b"big ring")


def test_a_region_ending_at_4_gib_is_accepted(make_host):
    """base == 4 GiB - size, the last place the identity map allows."""
    host = make_host()
    top = (1 << 32) - host.mapped
    moved = lib.gh_map_fixed(top, host.mapped)
    if moved == ffi.NULL:
        pytest.skip("the top of the low 4 GiB is in use in this process")
    try:
        ffi.memmove(moved, host.mem, host.mapped)
        shift = top - host.base
        region = ffi.cast("struct shm_region *", moved)
        region.dev[0].rx += shift
        region.dev[0].tx += shift
        host.ext.shm_region = top
        host.ext.shm_size = region.size = host.mapped
        lib.gh_boot_info().mem_size = top
        assert lib.gh_probe(1) == 1 and console() == ""
    finally:
        lib.gh_unmap(moved, host.mapped)


def two_devices(make_host) -> Host:
    return make_host(handles=(1, 2))


@pytest.mark.parametrize(("ring", "onto"), [("rx", "rx"), ("rx", "tx"), ("tx", "rx"), ("tx", "tx")])
def test_rings_of_two_devices_must_not_overlap(make_host, ring, onto):
    host = two_devices(make_host)
    second = host.region.dev[1]
    first = host.region.dev[0]
    # The second device's ring moved exactly onto one of the first's (and
    # so overlapping that one only).
    setattr(second, ring, getattr(first, onto))
    shift_ring(host, ring, 0, dev=1)
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format("rings overlap")


def test_device_entries_past_the_count_are_not_read(make_host):
    """The header's dev[] past ndevices is not part of the region: a device
    named there (with rings that were never validated) is not served."""
    host = two_devices(make_host)
    host.region.ndevices = 1
    host.region.dev[1].tx = host.region.dev[1].rx  # would fail the validation
    assert lib.gh_probe(1) == 1
    assert lib.gh_probe(2) == 0
    assert console() == ""
    assert lib.gh_yield_served() == 1 << 1 and lib.gh_yield_others() == 1 << 2


def test_a_device_listed_twice_is_rejected(make_host):
    host = two_devices(make_host)
    host.region.dev[1].handle = 1
    assert lib.gh_probe(1) == 0
    assert console() == REJECTED.format("device listed twice")


def test_the_region_header_is_read_once(make_host):
    """What the host writes into the header after the validation is not
    seen: the second device still gets the rings that were validated."""
    host = two_devices(make_host)
    assert lib.gh_probe(1) == 1
    rx2 = host.rx(2)
    host.region.magic = 0
    host.region.dev[1].rx = host.region.dev[0].rx
    assert lib.gh_probe(2) == 1
    assert console() == ""
    assert lib.gh_yield_served() == (1 << 1) | (1 << 2)
    rx2.prod = 1
    rx2.slot[0].len = 4
    ffi.memmove(rx2.slot[0].data, b"two!", 4)
    assert read(2) == (OK, b"two!")
    assert read(1) == (AGAIN, b"")


# ---- RX: the host produces ---------------------------------------------------


def test_frames_are_read_in_order_and_each_slot_given_back(host):
    frames = [frame(i, 60 + i) for i in range(5)]
    host.send(1, *frames)
    for i, f in enumerate(frames):
        assert read() == (OK, f)
        assert host.rx(1).cons == i + 1
    assert read() == (AGAIN, b"")
    assert stats()["rx_frames"] == 5
    assert stats()["rx_dropped"] == 0 and stats()["bad_index"] == 0


def test_a_full_ring_of_frames_is_read(host):
    frames = [frame(i) for i in range(host.slots)]
    host.send(1, *frames)
    assert [read() for _ in frames] == [(OK, f) for f in frames]
    assert read() == (AGAIN, b"")


@pytest.mark.parametrize("ahead", [9, 1 << 31, M32])
def test_an_impossible_producer_index_fails_each_read(host, ahead):
    """prod more than a ring ahead of cons (M32: behind it): every read is
    SOLO5_R_EUNSPEC, counted once each; nothing is consumed; once the host
    is sane again reading goes on."""
    host.send(1, b"before")
    assert read() == (OK, b"before")
    host.rx(1).prod = (1 + ahead) & M32
    for n in (1, 2, 3):
        assert read() == (EUNSPEC, b"")
        assert stats()["bad_index"] == n
    assert read_zc()[0] == EUNSPEC
    assert stats()["bad_index"] == 4
    assert host.rx(1).cons == 1 and stats()["rx_frames"] == 1
    assert lib.gh_yield_ready() == 1 << 1  # ready: the read reports the error
    host.rx(1).prod = 1
    host.send(1, b"after")
    assert read() == (OK, b"after")
    assert stats()["bad_index"] == 4 and stats()["rx_dropped"] == 0


def test_published_frames_are_read_even_if_the_index_then_breaks(host):
    """The producer index is read once per run of frames: frames it
    published stay published, whatever it writes afterwards."""
    host.send(1, b"one", b"two")
    assert read() == (OK, b"one")
    host.rx(1).prod = 1000
    assert read() == (OK, b"two")
    assert read() == (EUNSPEC, b"")
    assert stats()["bad_index"] == 1


@pytest.mark.parametrize("length", [0, DATA + 1, 1 << 31, M32])
def test_a_slot_with_a_bad_length_is_skipped_and_counted(host, length):
    host.put(1, b"x" * 16, length)
    host.rx(1).prod = 1
    host.send(1, b"good")
    assert read() == (OK, b"good")
    assert host.rx(1).cons == 2
    assert stats()["rx_dropped"] == 1 and stats()["rx_frames"] == 1
    assert read() == (AGAIN, b"")


def test_bad_slots_are_skipped_up_to_an_empty_ring(host):
    for i in range(3):
        host.put_at(1, i, b"", 0)
    host.rx(1).prod = 3
    assert read() == (AGAIN, b"")
    assert host.rx(1).cons == 3
    assert stats()["rx_dropped"] == 3
    host.send(1, b"next")
    assert read() == (OK, b"next")


def test_a_frame_of_a_whole_slot_is_read(host):
    big = frame(7, DATA)
    host.send(1, big)
    assert read(size=DATA) == (OK, big)


def test_a_frame_longer_than_the_callers_buffer_is_dropped(host):
    host.send(1, frame(1, 100), frame(2, 99), frame(3, 100))
    assert read(size=99) == (OK, frame(2, 99))  # the first does not fit
    assert stats()["rx_dropped"] == 1
    assert read(size=100) == (OK, frame(3, 100))  # exactly fits
    assert stats()["rx_dropped"] == 1 and stats()["rx_frames"] == 2


def test_a_zero_copy_read_lends_the_slot_until_it_is_done(host):
    host.send(1, b"first", b"second")
    r, where, data = read_zc()
    assert (r, data) == (OK, b"first")
    assert addr(where) == addr(host.rx(1).slot[0].data)
    assert host.rx(1).cons == 0  # still the guest's
    lib.gh_read_done(1)
    assert host.rx(1).cons == 1
    lib.gh_read_done(1)  # nothing lent: nothing given back
    assert host.rx(1).cons == 1
    r, where, data = read_zc()
    assert (r, data) == (OK, b"second") and addr(where) == addr(host.rx(1).slot[1].data)
    host.send(1, b"third")
    assert read() == (OK, b"third")  # gives the lent slot back first
    assert host.rx(1).cons == 3
    assert stats()["rx_frames"] == 3


def test_a_zero_copy_read_gives_the_last_slot_back_before_the_next(host):
    host.send(1, b"a", b"b")
    assert read_zc()[2] == b"a"
    assert read_zc()[2] == b"b"
    assert host.rx(1).cons == 1
    assert read_zc()[0] == AGAIN
    assert host.rx(1).cons == 2


def test_a_zero_copy_read_skips_bad_slots(host):
    host.put_at(1, 0, b"", DATA + 1)
    host.rx(1).prod = 1
    host.send(1, b"ok")
    r, _, data = read_zc()
    assert (r, data) == (OK, b"ok")
    assert stats()["rx_dropped"] == 1 and host.rx(1).cons == 1


# ---- the yield hooks --------------------------------------------------------


def test_ready_names_the_devices_with_frames_waiting(make_host):
    host = make_host(handles=(1, 3))
    assert lib.gh_probe(1) == 1 and lib.gh_probe(3) == 1
    assert lib.gh_yield_ready() == 0
    host.send(3, b"three")
    assert lib.gh_yield_ready() == 1 << 3
    host.send(1, b"one")
    assert lib.gh_yield_ready() == (1 << 1) | (1 << 3)
    assert read_zc(3)[0] == OK
    assert lib.gh_yield_ready() == 1 << 1  # a lent slot is not news
    host.send(3, b"more")
    assert lib.gh_yield_ready() == (1 << 1) | (1 << 3)


def test_sleep_is_announced_on_every_ring_and_withdrawn_when_frames_came(make_host):
    host = make_host(handles=(1, 3))
    assert lib.gh_probe(1) == 1 and lib.gh_probe(3) == 1
    assert lib.gh_yield_prepare_sleep() == 1
    assert host.rx(1).cons_sleeping == 1 and host.rx(3).cons_sleeping == 1
    assert lib.gh_yield_awake() == 0
    assert host.rx(1).cons_sleeping == 0 and host.rx(3).cons_sleeping == 0
    host.send(3, b"x")
    assert lib.gh_yield_prepare_sleep() == 0
    assert host.rx(1).cons_sleeping == 0 and host.rx(3).cons_sleeping == 0
    host.rx(3).prod = 100  # broken: nothing to consume either, sleep
    assert lib.gh_yield_prepare_sleep() == 1


# ---- TX: the guest produces --------------------------------------------------


def test_a_queued_frame_is_published_without_a_kick(host):
    assert queue(b"hello") == OK
    tx = host.tx(1)
    assert tx.prod == 1
    assert tx.slot[0].len == 5 and ffi.buffer(tx.slot[0].data, 5)[:] == b"hello"
    assert lib.gh_kicks == 0
    assert stats()["tx_frames"] == 1


def test_a_flush_kicks_only_a_sleeping_host_and_only_with_news(host):
    tx = host.tx(1)
    lib.gh_flush(1)  # nothing queued
    assert lib.gh_kicks == 0 and stats()["kicks_suppressed"] == 0
    queue(b"a")
    lib.gh_flush(1)  # awake host: no kick
    assert lib.gh_kicks == 0
    assert stats()["kicks"] == 0 and stats()["kicks_suppressed"] == 1
    tx.cons_sleeping = 1
    lib.gh_flush(1)  # asleep, but nothing new since the last flush
    assert lib.gh_kicks == 0 and stats()["kicks_suppressed"] == 1
    queue(b"b")
    queue(b"c")
    lib.gh_flush(1)  # asleep, two new frames: one kick
    assert lib.gh_kicks == 1 and lib.gh_last_io_port == lib.SHM_KICK_PIO
    assert stats()["kicks"] == 1 and stats()["kicks_suppressed"] == 1
    lib.gh_flush(1)
    assert lib.gh_kicks == 1
    assert lib.gh_stray_io == 0 and lib.gh_other_hypercalls == 0
    assert host.take(1) == [b"a", b"b", b"c"]


def test_a_write_is_queued_and_flushed(host):
    host.tx(1).cons_sleeping = 1
    assert write(b"now") == OK
    assert lib.gh_kicks == 1 and stats()["kicks"] == 1
    host.tx(1).cons_sleeping = 0
    assert write(b"then") == OK
    assert lib.gh_kicks == 1 and stats()["kicks_suppressed"] == 1
    assert host.take(1) == [b"now", b"then"]
    assert stats()["tx_frames"] == 2 and lib.gh_polls == 0


def test_an_empty_write_is_refused(host):
    assert write(b"") == EINVAL
    assert host.tx(1).prod == 0 and stats()["tx_frames"] == 0


def test_a_full_ring_counts_once_per_episode(host):
    for i in range(host.slots):
        assert queue(frame(i)) == OK
    assert queue(b"over") == AGAIN
    assert queue(b"over") == AGAIN
    assert stats()["tx_ring_full"] == 1
    assert stats()["tx_frames"] == host.slots
    host.tx(1).cons = 1  # the host took one
    assert queue(b"fits") == OK
    assert queue(b"over") == AGAIN
    assert stats()["tx_ring_full"] == 2
    assert host.tx(1).prod == host.slots + 1
    assert host.take(1) == [frame(i) for i in range(1, host.slots)] + [b"fits"]


def fill(host: Host) -> None:
    for i in range(host.slots):
        assert queue(frame(i)) == OK


def test_a_write_to_a_full_ring_kicks_and_waits_for_a_free_slot(host):
    fill(host)
    host.tx(1).cons_sleeping = 1

    @ffi.callback("void(void)")
    def host_takes_one() -> None:
        if lib.gh_polls == 3:
            host.tx(1).cons = 1

    lib.gh_poll_hook = host_takes_one
    assert write(b"waited") == OK
    assert lib.gh_kicks == 2  # the full ring's frames, then the new one
    assert lib.gh_polls == 3
    assert lib.gh_poll_timeout == WAIT_SLEEP_NS
    # Its first poll at its first look at the clock past WAIT_SPIN_NS (the
    # wait began at 0; the clock moves 1 ns a look).
    assert lib.gh_first_poll_at == WAIT_SPIN_NS + STEP_NS
    assert host.tx(1).prod == host.slots + 1
    assert stats()["tx_ring_full"] == 1 and stats()["tx_frames"] == host.slots + 1


def test_a_write_gives_up_when_the_host_takes_nothing(host):
    fill(host)
    assert write(b"lost") == AGAIN
    # It waited TX_WAIT_NS on the clock: the last look just past it.
    assert TX_WAIT_NS < lib.gh_clock_ns <= TX_WAIT_NS + WAIT_SLEEP_NS + 2 * STEP_NS
    assert host.tx(1).prod == host.slots
    assert stats()["tx_ring_full"] == 1
    assert stats()["kicks_suppressed"] == 1  # its flush found the host awake


def test_a_wait_of_exactly_its_limit_is_not_over(host):
    """The wait gives up once more than TX_WAIT_NS went by: at exactly
    TX_WAIT_NS it polls once more, and the host frees a slot then."""
    fill(host)

    @ffi.callback("void(void)")
    def host_acts() -> None:
        if lib.gh_polls == 1:
            lib.gh_clock_ns = TX_WAIT_NS  # the wait began at 0: its next look
        elif lib.gh_polls == 2:
            host.tx(1).cons = 1

    lib.gh_poll_hook = host_acts
    assert write(b"just") == OK
    assert lib.gh_polls == 2


def test_a_write_gets_the_slot_freed_at_the_last_look(host):
    """The host frees a slot just as the wait's time is up (between its
    last look at the clock and the ring): the final look sees it."""
    fill(host)

    @ffi.callback("void(void)")
    def late() -> None:
        if lib.gh_clock_ns > TX_WAIT_NS + STEP_NS:
            host.tx(1).cons = 1

    lib.gh_clock_hook = late
    assert write(b"late") == OK
    assert host.take(1)[-1] == b"late"


def test_tx_wait_sees_the_ring_emptied_at_the_last_look(host):
    queue(b"a")

    @ffi.callback("void(void)")
    def late() -> None:
        if lib.gh_clock_ns > TX_DRAIN_NS + STEP_NS:
            host.take(1)

    lib.gh_clock_hook = late
    assert lib.gh_tx_wait(1) == OK


@pytest.mark.parametrize("cons", [1, 5, M32 - 8])
def test_an_impossible_consumer_index_fails_queue_write_and_tx_wait(host, cons):
    """cons ahead of prod (1, 5) or more than a ring behind it."""
    host.tx(1).cons = cons
    assert queue(b"q") == EUNSPEC
    assert stats()["bad_index"] == 1
    assert write(b"w") == EUNSPEC
    assert stats()["bad_index"] == 2
    assert lib.gh_tx_wait(1) == EUNSPEC
    assert stats()["bad_index"] == 3
    assert lib.gh_polls == 0  # a broken index is not waited for
    assert host.tx(1).prod == 0 and stats()["tx_frames"] == 0
    assert stats()["tx_ring_full"] == 0 and lib.gh_kicks == 0
    host.tx(1).cons = 0  # sane again
    assert write(b"ok") == OK
    assert host.take(1) == [b"ok"]


def test_a_consumer_index_a_whole_ring_behind_is_a_full_ring(host):
    fill(host)
    assert host.tx(1).cons == 0
    assert queue(b"x") == AGAIN
    assert stats()["bad_index"] == 0


def test_a_broken_index_during_the_wait_fails_the_write(host):
    fill(host)

    @ffi.callback("void(void)")
    def breaks() -> None:
        host.tx(1).cons = 1000

    lib.gh_poll_hook = breaks
    assert write(b"x") == EUNSPEC
    assert stats()["bad_index"] == 1
    assert lib.gh_polls == 1


def test_tx_wait_is_done_at_once_when_the_host_took_everything(host):
    host.tx(1).cons_sleeping = 1
    queue(b"a")
    queue(b"b")
    host.take(1)
    assert lib.gh_tx_wait(1) == OK
    assert lib.gh_kicks == 1  # it flushed first
    assert lib.gh_polls == 0


def test_tx_wait_waits_for_the_host_to_take_every_frame(host):
    queue(b"a")
    queue(b"b")

    @ffi.callback("void(void)")
    def host_takes() -> None:
        if lib.gh_polls == 2:
            host.take(1)

    lib.gh_poll_hook = host_takes
    assert lib.gh_tx_wait(1) == OK
    assert lib.gh_polls == 2


def test_tx_wait_gives_up_after_a_second(host):
    queue(b"a")
    host.tx(1).cons = 0
    assert lib.gh_tx_wait(1) == AGAIN
    assert TX_DRAIN_NS < lib.gh_clock_ns <= TX_DRAIN_NS + WAIT_SLEEP_NS + 2 * STEP_NS
    assert stats()["bad_index"] == 0


def test_tx_wait_on_a_partly_taken_ring_is_not_done(host):
    queue(b"a")
    queue(b"b")
    host.tx(1).cons = 1
    assert lib.gh_tx_wait(1) == AGAIN


def test_exit_waits_for_every_served_device(make_host):
    host = make_host(handles=(1, 3))
    assert lib.gh_probe(1) == 1 and lib.gh_probe(3) == 1
    for h in (1, 3):
        host.tx(h).cons_sleeping = 1
        assert queue(b"bye", h=h) == OK
    taken = {}

    @ffi.callback("void(void)")
    def host_drains() -> None:
        for h in (1, 3):
            taken.setdefault(h, []).extend(host.take(h))

    lib.gh_poll_hook = host_drains
    assert lib.gh_run_exit_hook() == 1
    assert taken == {1: [b"bye"], 3: [b"bye"]}
    assert lib.gh_kicks == 2
    assert stats(1)["kicks"] == 1 and stats(3)["kicks"] == 1


def test_stats_are_per_device(make_host):
    host = make_host(handles=(1, 3))
    assert lib.gh_probe(1) == 1 and lib.gh_probe(3) == 1
    host.send(3, b"x")
    assert read(3) == (OK, b"x")
    assert write(b"y", h=1) == OK
    assert (stats(1)["rx_frames"], stats(1)["tx_frames"]) == (0, 1)
    assert (stats(3)["rx_frames"], stats(3)["tx_frames"]) == (1, 0)

"""Which path a guest's frames take, decided once per run (the net kind's plan).

Plain hvt hypercalls, pyvmm's shmstream region (for a guest whose
capability note asks for it) or Solo5's own ring (v0.11+ guests, unless
--no-net-ring), the latter two at the top of guest memory and served by the
native IO thread. Also the net kind's kind-wide options (--shm,
--shm-slots, --tap-read, --hybrid-budget, --no-net-ring) and their checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.common.errors import UsageError
from pyvmm.common.sizes import MIB
from pyvmm.common.values import one_of, positive_int
from pyvmm.devices import DeviceOptions, RunSettings, kind_setting
from pyvmm.devices.iothread import DEFAULT_HYBRID_BUDGET_US, IoConfig
from pyvmm.devices.net.shmstream import ShmLayout
from pyvmm.devices.net.solo5_ring import RING_AREA

if TYPE_CHECKING:
    from pyvmm.devices import Request
    from pyvmm.loader import Kernel

# The IO thread mode when --shm is not given (docs/modes.md says why).
DEFAULT_SHM_MODE = "event"
SHM_VALUES = ("off", "poll", "event", "hybrid")
# How the IO thread reads a shmstream device's tap: one readv per frame,
# batched reads through io_uring, or io_uring where the host allows it
# (docs/modes.md, "Batched tap reads"). readv until measured better.
TAP_READ_VALUES = ("readv", "uring", "auto")
DEFAULT_TAP_READ = "readv"
# Who serves a kick of Solo5's ring in event and hybrid mode: the IO thread,
# which KVM wakes through an ioeventfd, or the vCPU thread at the kick's exit
# to user space (docs/solo5-bindings.md, "Who serves a kick"). The thread by
# default: on PVM hosts an exit to user space costs three in-kernel kicks,
# which doubles a round trip's price for the few frames/s it saves.
NET_RING_KICKS_VALUES = ("thread", "exit")
DEFAULT_NET_RING_KICKS = "thread"
# The hybrid budget is microseconds of polling without work; past a second
# it is poll mode, and the C side holds it in 32 bits.
MAX_HYBRID_BUDGET_US = 1_000_000


shm_value = one_of(SHM_VALUES)
tap_read_value = one_of(TAP_READ_VALUES)
net_ring_kicks_value = one_of(NET_RING_KICKS_VALUES)


def shm_slots(name: str, value: str) -> int:
    slots = positive_int(name, value)
    if slots & (slots - 1) or not 2 <= slots <= lib.SHM_MAX_SLOTS:
        raise UsageError(f"{name}: {slots} is not a power of two in [2, {lib.SHM_MAX_SLOTS}]")
    return slots


def hybrid_budget(name: str, value: str) -> int:
    return positive_int(name, value, MAX_HYBRID_BUDGET_US)


def check_options(options: DeviceOptions) -> None:
    """The kind-wide options' combinations (before any file is read)."""
    if (
        kind_setting(options, "hybrid-budget") is not None
        and kind_setting(options, "shm") != "hybrid"
    ):
        raise UsageError("--hybrid-budget applies only to --shm=hybrid")
    if kind_setting(options, "net-ring-kicks") == "exit" and kind_setting(options, "shm") in (
        "off",
        "poll",
    ):
        # Poll mode's guest never kicks; off has no ring.
        raise UsageError("--net-ring-kicks=exit applies only to --shm=event or hybrid")


class NetPlan:
    """The net devices' path for one run, and what it reserves."""

    __slots__ = ("bottom", "shm_mode", "shm_layout", "solo5_ring_gpa", "io", "tap_read", "_why")

    def __init__(
        self,
        bottom: int,
        shm_mode: str,
        shm_layout: ShmLayout | None,
        solo5_ring_gpa: int | None,
        io: IoConfig,
        why: str,
        tap_read: str = DEFAULT_TAP_READ,
    ) -> None:
        self.bottom = bottom
        #: "off" or the IO thread mode serving a shmstream region.
        self.shm_mode = shm_mode
        self.shm_layout = shm_layout
        #: Where Solo5's own ring lives, when the guest gets it.
        self.solo5_ring_gpa = solo5_ring_gpa
        self.io = io
        #: How the IO thread reads the shmstream devices' taps (TAP_READ_VALUES).
        self.tap_read = tap_read
        self._why = why  # why plain hypercalls, when neither ring

    def explain(self) -> list[str]:
        if self.shm_layout is not None:
            layout = self.shm_layout
            return [
                f"net: shmstream region at {layout.gpa:#x} ({layout.size // MIB} MiB, "
                f"{layout.slots} slots per ring), IO thread in {self.shm_mode} mode, "
                f"tap reads: {self.tap_read}"
            ]
        if self.solo5_ring_gpa is not None:
            return [
                f"net: Solo5's ring I/O at {self.solo5_ring_gpa:#x} ({RING_AREA} bytes), served "
                f"by the IO thread in {self.io.mode} mode (--no-net-ring: hypercalls)"
            ]
        if self._why:
            return [f"net: hvt hypercalls, one exit per frame ({self._why})"]
        return []


def plan_net(config: RunSettings, kernel: Kernel, requests: list[Request], top: int) -> NetPlan:
    """Where the net devices' rings go (below ``top``), and in which mode
    the IO thread serves them."""
    options = config.devices
    shm = kind_setting(options, "shm")
    slots = kind_setting(options, "shm-slots")
    tap_read = kind_setting(options, "tap-read")
    nets = tuple(sorted(r.handle for r in requests))
    shm_mode = choose_shm(shm, kernel, bool(nets))
    for flag, given in (("--shm-slots", slots), ("--tap-read", tap_read)):
        if given is not None and shm_mode == "off":
            why = "--shm=off" if shm == "off" else "no net device or no shmstream driver"
            raise UsageError(f"{flag}: {kernel.path} gets no shmstream region ({why})")
    layout = None
    bottom = top
    if shm_mode != "off":
        layout = ShmLayout.plan(top, nets, slots)
        bottom = layout.gpa
    ring_gpa = None
    if choose_solo5_ring(config, kernel, bool(nets), shm_mode):
        if bottom <= RING_AREA:
            raise UsageError(
                f"Not enough guest memory for ring allocation: --mem={config.mem_mib} is too "
                f"small for the Solo5 net ring (--no-net-ring uses hypercalls instead)"
            )
        bottom -= RING_AREA
        ring_gpa = bottom
    io = IoConfig(
        mode=shm if shm not in (None, "off") else DEFAULT_SHM_MODE,
        hybrid_budget_us=kind_setting(options, "hybrid-budget") or DEFAULT_HYBRID_BUDGET_US,
        cpu=config.pin_io,
        kicks=kind_setting(options, "net-ring-kicks") or DEFAULT_NET_RING_KICKS,
    )
    why = ""
    if nets and layout is None and ring_gpa is None:
        if shm == "off":
            why = "--shm=off"
        elif kind_setting(options, "no-net-ring"):
            why = "--no-net-ring"
        else:
            why = "ABI version 1 or no ring driver"
    return NetPlan(bottom, shm_mode, layout, ring_gpa, io, why, tap_read or DEFAULT_TAP_READ)


def choose_shm(requested: str | None, kernel: Kernel, has_nets: bool) -> str:
    """The shmstream mode for this guest's net devices, or "off".

    Only a guest that declares a shmstream driver gets the region. For any
    other guest an explicit mode still sets how the IO thread serves
    Solo5's own ring (see choose_solo5_ring).
    """
    if requested == "off" or not has_nets or not kernel.capabilities.shmstream:
        return "off"
    if kernel.abi.legacy:  # reads no host features: cannot find a region
        return "off"
    return requested or DEFAULT_SHM_MODE


def choose_solo5_ring(config: RunSettings, kernel: Kernel, has_nets: bool, shm_mode: str) -> bool:
    """Whether to offer Solo5's ring I/O, as solo5-hvt does unless told not to."""
    shm = kind_setting(config.devices, "shm")
    serve = (
        shm_mode == "off"
        and has_nets
        and shm != "off"
        and not kind_setting(config.devices, "no-net-ring")
        and not kernel.abi.legacy
    )
    if shm not in (None, "off") and shm_mode == "off" and not serve:
        if not has_nets:
            why = "no net device"
        elif kernel.abi.legacy:
            why = "ABI version 1, which knows no rings"
        else:
            why = "no shmstream driver and --no-net-ring is set"
        raise UsageError(f"--shm={shm}: nothing to serve: {kernel.path} has {why}")
    return serve

"""What a run asks for, as parsed from the command line (see cli.py)."""

from __future__ import annotations

from pyvmm.common.record import MutableRecord

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_MEM_MIB = 512


class VmConfig(MutableRecord):
    """Every setting of a run, named by keyword arguments; the parameters'
    defaults are the defaults (lists and dicts are fresh for each config).

    A record, not a dataclass: the dataclasses module and the code it
    generates cost the command milliseconds of every start (docs/startup.md).
    Its settings change while the command line is parsed, so it is mutable,
    compared by value and unhashable.
    """

    __slots__ = (
        "kernel",
        "guest_args",
        "mem_mib",
        "devices",
        "cpl",
        "legacy_abi",
        "sandbox",
        "user",
        "pin_vcpu",
        "pin_io",
        "snapshot_at",
        "snapshot_dir",
        "snapshot_stop",
        "restore",
        "stats",
        "stats_interval",
        "stats_json",
        "dumpcore",
        "gdb",
        "gdb_port",
        "gdb_socket",
    )

    def __init__(
        self,
        kernel: str,
        *,
        guest_args: list[str] | None = None,
        mem_mib: int = DEFAULT_MEM_MIB,
        devices: dict[str, dict[str | None, Any]] | None = None,
        cpl: str = "auto",
        legacy_abi: bool = False,
        sandbox: bool = False,
        user: str | None = None,
        pin_vcpu: int | None = None,
        pin_io: int | None = None,
        snapshot_at: str | None = None,
        snapshot_dir: str | None = None,
        snapshot_stop: bool = False,
        restore: str | None = None,
        stats: bool = False,
        stats_interval: float | None = None,
        stats_json: str | None = None,
        dumpcore: str | None = None,
        gdb: bool = False,
        gdb_port: int | None = None,
        gdb_socket: str | None = None,
    ) -> None:
        self.kernel = kernel
        self.guest_args: list[str] = [] if guest_args is None else guest_args
        self.mem_mib = mem_mib
        # Device options (pyvmm.devices): flag -> {device name: value}, e.g.
        # {"net": {"service0": "tap100"}, "block": {"storage": "disk.img"}};
        # the short form --net=IFACE and a kind's own options (--shm=poll:
        # {"shm": {None: "poll"}}) are stored under the name None.
        self.devices: dict[str, dict[str | None, Any]] = {} if devices is None else devices
        # Privilege level of the guest: "auto", "0" or "3" (see plan.choose_mode).
        self.cpl = cpl
        # Also boot guests with Solo5 hvt ABI version 1 (Solo5 <= 0.9 builds).
        self.legacy_abi = legacy_abi
        # The seccomp filter (sandbox.py) once set-up is over: the command turns
        # it on (--no-sandbox: off); for in-process use (api.Guest) it is off
        # unless asked for, as it filters the whole process for good.
        self.sandbox = sandbox
        # Drop to this user once the devices are open (--user).
        self.user = user
        self.pin_vcpu = pin_vcpu
        self.pin_io = pin_io
        # Snapshots (pyvmm/vm/snapshot/): --snapshot-at=first-wait writes one to
        # --snapshot-dir=DIR when the guest first waits, then the run goes on
        # (or ends, --snapshot-stop); --restore=DIR resumes one instead of a boot.
        self.snapshot_at = snapshot_at
        self.snapshot_dir = snapshot_dir
        self.snapshot_stop = snapshot_stop
        self.restore = restore
        # Counters (statsview.py): a human summary on stderr at exit; with an
        # interval (seconds) also a line of rates per interval; JSON lines to a
        # file ("-": stderr, stdout being the console) at exit and per interval.
        self.stats = stats
        self.stats_interval = stats_interval
        self.stats_json = stats_json
        # --dumpcore=DIR: an ELF core of the guest in DIR on a fault or an abort
        # (pyvmm/vm/debug/core.py).
        self.dumpcore = dumpcore
        # --gdb, --gdb-port=N, --gdb-socket=PATH: a GDB stub (pyvmm/vm/debug/gdbstub.py)
        # on 127.0.0.1:gdb_port or the Unix socket gdb_socket.
        self.gdb = gdb
        self.gdb_port = gdb_port
        self.gdb_socket = gdb_socket

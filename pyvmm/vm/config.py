"""What a run asks for, as parsed from the command line (see cli.py)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_MEM_MIB = 512


class VmConfig:
    """Every setting of a run; keyword arguments name them, the class
    attributes below are the defaults (lists and dicts are fresh copies).

    A plain class, not a dataclass: the dataclasses module and the code it
    generates cost the command milliseconds of every start (docs/startup.md).
    """

    kernel: str
    guest_args: list[str] = []
    mem_mib: int = DEFAULT_MEM_MIB
    # Device options (pyvmm.devices): flag -> {device name: value}, e.g.
    # {"net": {"service0": "tap100"}, "block": {"storage": "disk.img"}};
    # the short form --net=IFACE and a kind's own options (--shm=poll:
    # {"shm": {None: "poll"}}) are stored under the name None.
    devices: dict[str, dict[str | None, Any]] = {}
    # Privilege level of the guest: "auto", "0" or "3" (see plan.choose_cpl).
    cpl: str = "auto"
    # Also boot guests with Solo5 hvt ABI version 1 (Solo5 <= 0.9 builds).
    legacy_abi: bool = False
    # The seccomp filter (sandbox.py) once set-up is over: the command turns
    # it on (--no-sandbox: off); for in-process use (api.Guest) it is off
    # unless asked for, as it filters the whole process for good.
    sandbox: bool = False
    # Drop to this user once the devices are open (--user).
    user: str | None = None
    pin_vcpu: int | None = None
    pin_io: int | None = None
    # Snapshots (pyvmm/vm/snapshot/): --snapshot-at=first-wait writes one to
    # --snapshot-dir=DIR when the guest first waits, then the run goes on
    # (or ends, --snapshot-stop); --restore=DIR resumes one instead of a boot.
    snapshot_at: str | None = None
    snapshot_dir: str | None = None
    snapshot_stop: bool = False
    restore: str | None = None
    # Counters (statsview.py): a human summary on stderr at exit; with an
    # interval (seconds) also a line of rates per interval; JSON lines to a
    # file ("-": stderr, stdout being the console) at exit and per interval.
    stats: bool = False
    stats_interval: float | None = None
    stats_json: str | None = None
    # --dumpcore=DIR: an ELF core of the guest in DIR on a fault or an abort
    # (pyvmm/vm/debug/core.py).
    dumpcore: str | None = None
    # --gdb, --gdb-port=N, --gdb-socket=PATH: a GDB stub (pyvmm/vm/debug/gdbstub.py)
    # on 127.0.0.1:gdb_port or the Unix socket gdb_socket.
    gdb: bool = False
    gdb_port: int | None = None
    gdb_socket: str | None = None

    def __init__(self, kernel: str, **settings: Any) -> None:
        self.kernel = kernel
        self.guest_args = []
        self.devices = {}
        for name, value in settings.items():
            if name not in _SETTINGS:
                raise TypeError(f"VmConfig() got an unexpected keyword argument '{name}'")
            setattr(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in ("kernel", *_SETTINGS))

    def __eq__(self, other: object) -> bool:
        if type(other) is not VmConfig:
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  (mutable, as the dataclass was)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in ("kernel", *_SETTINGS))
        return f"VmConfig({shown})"


_SETTINGS = tuple(name for name in VmConfig.__annotations__ if name != "kernel")

"""The ``pyvmm`` command: solo5-hvt's command line, accepted as is.

    pyvmm [OPTIONS] [--] KERNEL [ARGS...]

Tender options all come before the unikernel path; the first argument that
is not an option (or the one after ``--``) is the unikernel and every
argument after it belongs to the guest, even one starting with ``--``.
Every error ends in one line on stderr and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import os
import re
import sys

from pyvmm import __version__
from pyvmm.config import DEFAULT_MEM_MIB, VmConfig
from pyvmm.errors import PyvmmError, UsageError

USAGE = f"""\
usage: pyvmm [OPTIONS] [--] KERNEL [ARGS...]

Run a Solo5 hvt unikernel on KVM. Options (solo5-hvt compatible):
  --mem=N                       guest memory in MiB (default {DEFAULT_MEM_MIB})
  --net:NAME=IFACE              attach net device NAME to tap IFACE (or @FD:
                                an already open tap file descriptor)
  --net=IFACE                   the same, when the manifest has one net device
  --net-mac:NAME=HWADDR         guest MAC address of net device NAME
  --block:NAME=PATH             attach block device NAME to PATH (a file or
                                a host block device)
  --block-sector-size:NAME=N    sector size of block device NAME (default 512)
  --cpl=auto|0|3                privilege level of the guest: 3 (user mode,
                                native speed on PVM hosts) needs a guest that
                                declares it; auto picks 3 for such a guest on
                                a PVM host, else 0 (default auto)
  --shm=off|poll|event|hybrid   shmstream ring networking for guests with a
                                shmstream driver: the IO thread's mode
                                (default event; off = plain hypercalls)
  --hybrid-budget=US            hybrid mode: keep polling this many
                                microseconds without work before sleeping
                                (default 50)
  --no-net-ring                 do not offer Solo5's ring I/O to Solo5 v0.11+
                                unikernels (as solo5-hvt's option)
  --legacy-abi                  also boot unikernels with hvt ABI version 1
                                (built with Solo5 0.9 or older): plain
                                hypercalls, no rings
  --shm-slots=N                 slots per ring, a power of two (default: as
                                many as fit in 1/8 of guest memory, <= 4096)
  --pin=vcpu=N,io=M             pin the vCPU thread and/or the IO thread
                                to CPUs (also: --pin vcpu=N,io=M)
  --stats                       print counters as JSON on stderr at exit
                                (VM exits seen by pyvmm and by KVM,
                                shmstream frames, drops, kicks, wake-ups)
  --help                        show this help
  --version, --host-info        show version and what this host's KVM provides
Everything after KERNEL is the guest's command line.
"""

_NAMED = re.compile(r"^--(net|net-mac|block|block-sector-size):([^=]*)=(.*)$")
_NAME_OK = re.compile(r"^[A-Za-z0-9]{1,67}$")


def _positive_int(option: str, text: str, most: int | None = None) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) <= 0:
        raise UsageError(f"{option}: '{text}' is not a positive integer")
    if most is not None and int(text) > most:
        raise UsageError(f"{option}: {text} is more than {most}")
    return int(text)


# The hybrid budget is microseconds of polling without work; past a second
# it is poll mode, and the C side holds it in 32 bits.
MAX_HYBRID_BUDGET_US = 1_000_000


def _parse_pin(value: str, config: VmConfig) -> None:
    cpus = os.sched_getaffinity(0)
    for part in value.split(","):
        thread, _, cpu = part.partition("=")
        if thread not in ("vcpu", "io") or not re.fullmatch(r"[0-9]{1,6}", cpu):
            raise UsageError(f"--pin: '{part}' is not vcpu=N or io=N")
        if int(cpu) not in cpus:
            raise UsageError(f"--pin: CPU {cpu} is not available (usable: {sorted(cpus)})")
        setattr(config, f"pin_{thread}", int(cpu))


def parse_args(argv: list[str]) -> VmConfig | str:
    """A VmConfig, or "help" / "version" for those requests."""
    config = VmConfig(kernel="")
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg in ("--help", "-h"):
            return "help"
        if arg in ("--version", "--host-info"):
            return "version"
        if arg.startswith("--mem="):
            config.mem_mib = _positive_int("--mem", arg[len("--mem=") :])
        elif arg.startswith("--shm="):
            value = arg[len("--shm=") :]
            if value not in ("off", "poll", "event", "hybrid"):
                raise UsageError(f"--shm: '{value}' is not one of off, poll, event, hybrid")
            config.shm = value
        elif arg.startswith("--hybrid-budget="):
            config.hybrid_budget_us = _positive_int(
                "--hybrid-budget", arg.split("=", 1)[1], MAX_HYBRID_BUDGET_US
            )
        elif arg.startswith("--shm-slots="):
            slots = _positive_int("--shm-slots", arg.split("=", 1)[1])
            if slots & (slots - 1) or not 2 <= slots <= 32768:
                raise UsageError(f"--shm-slots: {slots} is not a power of two in [2, 32768]")
            config.shm_slots = slots
        elif arg == "--pin" or arg.startswith("--pin="):
            if arg == "--pin":
                i += 1
                if i >= len(argv):
                    raise UsageError("--pin: missing value (e.g. --pin vcpu=0,io=1)")
                value = argv[i]
            else:
                value = arg[len("--pin=") :]
            _parse_pin(value, config)
        elif arg == "--no-net-ring":
            config.no_net_ring = True
        elif arg == "--legacy-abi":
            config.legacy_abi = True
        elif arg == "--stats":
            config.stats = True
        elif arg.startswith("--cpl="):
            value = arg[len("--cpl=") :]
            if value not in ("auto", "0", "3"):
                raise UsageError(f"--cpl: '{value}' is not one of auto, 0, 3")
            config.cpl = value
        elif arg.startswith("--net="):
            iface = arg[len("--net=") :]
            if not iface:
                raise UsageError("--net=: missing interface name")
            config.default_net = iface
        elif match := _NAMED.match(arg):
            kind, name, value = match.groups()
            if not _NAME_OK.match(name):
                raise UsageError(f"{arg}: invalid device name '{name}' (1-67 of [A-Za-z0-9])")
            if not value:
                raise UsageError(f"{arg}: missing value after '='")
            table = {
                "net": config.nets,
                "net-mac": config.net_macs,
                "block": config.blocks,
                "block-sector-size": config.block_sector_sizes,
            }[kind]
            if name in table:
                raise UsageError(f"--{kind}:{name} given twice")
            if kind == "block-sector-size":
                table[name] = _positive_int(f"--{kind}:{name}", value)
            else:
                table[name] = value
        else:
            raise UsageError(f"unknown option '{arg}' (see pyvmm --help)")
        i += 1
    if i >= len(argv):
        raise UsageError("missing KERNEL (see pyvmm --help)")
    config.kernel = argv[i]
    config.guest_args = argv[i + 1 :]
    if config.hybrid_budget_us is not None and config.shm != "hybrid":
        raise UsageError("--hybrid-budget applies only to --shm=hybrid")
    return config


def version_text() -> str:
    """Our version, the ABI, and what this host's KVM provides."""
    lines = [f"pyvmm {__version__} (Solo5 hvt ABI 2)"]
    try:
        from pyvmm.kvm import System

        with System() as kvm:
            info = kvm.host_info()
    except PyvmmError as err:
        lines.append(f"host: {err}")
        return "\n".join(lines)

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    tsc = f"{info.tsc_khz / 1000:.3f} MHz" if info.tsc_khz else "unknown"
    lines += [
        f"host: {info.machine}, KVM flavour {info.flavour}"
        + (
            " (guest CPL 0 code is emulated; user-mode guests run natively)"
            if info.flavour == "pvm"
            else ""
        ),
        f"ioeventfd: {yes(info.ioeventfd)}, stats fd: {yes(info.stats_fd)}, "
        f"read-only memslots: {yes(info.readonly_mem)}, TSC: {tsc}",
        f"--cpl=auto runs user-mode capable guests at CPL {info.default_cpl}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parsed = parse_args(argv)
        if parsed == "help":
            sys.stdout.write(USAGE)
            return 0
        if parsed == "version":
            print(version_text())
            return 0
        from pyvmm.vmm import run

        return run(parsed)
    except PyvmmError as err:
        sys.stdout.flush()
        print(f"pyvmm: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        print("pyvmm: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a pyvmm bug: still one line, details on request
        if os.environ.get("PYVMM_DEBUG"):
            raise
        sys.stdout.flush()
        print(
            f"pyvmm: internal error: {type(err).__name__}: {err} "
            "(PYVMM_DEBUG=1 shows where; please report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

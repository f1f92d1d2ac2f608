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
import signal
import sys

from pyvmm import __version__
from pyvmm.config import DEFAULT_MEM_MIB, VmConfig, positive_int
from pyvmm.devices import kinds, option_table
from pyvmm.errors import PyvmmError, UsageError
from pyvmm.statsview import parse_interval

USAGE_TEMPLATE = f"""\
usage: pyvmm [OPTIONS] [--] KERNEL [ARGS...]

Run a Solo5 hvt unikernel on KVM. Options (solo5-hvt compatible):
  --mem=N                       guest memory in MiB (default {DEFAULT_MEM_MIB})
{{device_options}}  --cpl=auto|0|3|deprivileged   privilege level of the guest: 0 as solo5-hvt;
                                3 (user mode, native speed on PVM hosts) for
                                a guest that declares it; deprivileged runs
                                any other guest at 3, trapping and emulating
                                its privileged instructions; auto picks 3 or
                                deprivileged on a PVM host, else 0 (default)
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
  --stats[=INTERVAL]            counters on stderr: a summary at exit and, with
                                an interval (1s, 500ms), a line of rates per
                                interval (VM exits by reason, hypercalls,
                                frames, drops, kicks, wake-ups, CPU); SIGUSR1
                                prints the counters so far
  --stats-json=FILE             the counters as JSON (docs/stats.md) at exit,
                                and per interval with --stats=INTERVAL; FILE
                                - is stdout
  --help                        show this help
  --version, --host-info        show version and what this host's KVM provides
Everything after KERNEL is the guest's command line.
"""

_NAMED = re.compile(r"^--([a-z-]+):([^=]*)=(.*)$")
_SHORT = re.compile(r"^--([a-z-]+)=(.*)$")
_HELP_COLUMN = 32
CPL_VALUES = ("auto", "0", "3", "deprivileged")
_NAME_OK = re.compile(r"^[A-Za-z0-9]{1,67}$")


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
    devices = option_table()
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
            config.mem_mib = positive_int("--mem", arg[len("--mem=") :])
        elif arg.startswith("--shm="):
            value = arg[len("--shm=") :]
            if value not in ("off", "poll", "event", "hybrid"):
                raise UsageError(f"--shm: '{value}' is not one of off, poll, event, hybrid")
            config.shm = value
        elif arg.startswith("--hybrid-budget="):
            config.hybrid_budget_us = positive_int(
                "--hybrid-budget", arg.split("=", 1)[1], MAX_HYBRID_BUDGET_US
            )
        elif arg.startswith("--shm-slots="):
            slots = positive_int("--shm-slots", arg.split("=", 1)[1])
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
        elif arg == "--stats" or arg.startswith("--stats="):
            config.stats = True
            if arg != "--stats":
                config.stats_interval = parse_interval("--stats", arg[len("--stats=") :])
        elif arg.startswith("--stats-json="):
            path = arg[len("--stats-json=") :]
            if not path:
                raise UsageError("--stats-json=: missing FILE (or - for stdout)")
            config.stats_json = path
        elif arg.startswith("--cpl="):
            value = arg[len("--cpl=") :]
            if value not in CPL_VALUES:
                raise UsageError(f"--cpl: '{value}' is not one of {', '.join(CPL_VALUES)}")
            config.cpl = value
        elif (match := _NAMED.match(arg)) and match.group(1) in devices:
            _device_option(arg, *match.groups(), devices, config)
        elif (match := _SHORT.match(arg)) and devices.get(match.group(1), (0, None))[1].short:
            flag, value = match.groups()
            if not value:
                raise UsageError(f"--{flag}=: missing {devices[flag][1].metavar}")
            config.devices.setdefault(flag, {})[None] = value
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


def _device_option(arg: str, flag: str, name: str, value: str, devices, config) -> None:
    """``--FLAG:NAME=VALUE`` of a registered device kind."""
    _kind, option = devices[flag]
    if not _NAME_OK.match(name):
        raise UsageError(f"{arg}: invalid device name '{name}' (1-67 of [A-Za-z0-9])")
    if not value:
        raise UsageError(f"{arg}: missing value after '='")
    given = config.devices.setdefault(flag, {})
    if name in given:
        raise UsageError(f"--{flag}:{name} given twice")
    given[name] = option.parse(f"--{flag}:{name}", value)


def usage() -> str:
    """--help, with each registered device kind's options."""
    lines = []
    for kind in kinds():
        for opt in kind.options:
            forms = [(f"--{opt.flag}:NAME={opt.metavar}", opt.help)]
            if opt.short:
                forms.append(
                    (
                        f"--{opt.flag}={opt.metavar}",
                        f"the same, when the manifest has one {kind.label} device",
                    )
                )
            for form, text in forms:
                first, *rest = text.split("\n")
                lines.append(f"  {form:<{_HELP_COLUMN - 2}}{first}")
                lines += [" " * _HELP_COLUMN + more for more in rest]
    return USAGE_TEMPLATE.format(device_options="\n".join(lines) + "\n")


def version_text() -> str:
    """Our version, the ABI, and what this host's KVM provides."""
    lines = [f"pyvmm {__version__} (Solo5 hvt ABI 2)"]
    try:
        from pyvmm.host import host_info
        from pyvmm.kvm import System

        with System() as kvm:
            info = host_info(kvm)
    except PyvmmError as err:
        lines.append(f"host: {err}")
        return "\n".join(lines)

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    tsc = f"{info.cycle_freq / 1e6:.3f} MHz" if info.cycle_freq else "unknown"
    lines += [
        f"host: {info.machine}, KVM flavour {info.flavour}"
        + (
            " (guest CPL 0 code is emulated; user-mode guests run natively)"
            if info.flavour == "pvm"
            else ""
        ),
        f"ioeventfd: {yes(info.ioeventfd)}, stats fd: {yes(info.stats_fd)}, "
        f"read-only memslots: {yes(info.readonly_mem)}, TSC: {tsc}",
        "--cpl=auto runs "
        + (
            "user-mode capable guests at CPL 3, others deprivileged (CPL 3, trap and emulate)"
            if info.flavour == "pvm"
            else "guests at CPL 0"
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # SIGUSR1 asks a running guest's counters (statsview.py); before the
    # guest runs there are none to print, and it must not kill pyvmm.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        parsed = parse_args(argv)
        if parsed == "help":
            sys.stdout.write(usage())
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

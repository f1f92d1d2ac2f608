"""The ``pyvmm`` command: solo5-hvt's command line, accepted as is.

    pyvmm [OPTIONS] [--] KERNEL [ARGS...]
    pyvmm --query-manifest [--json] KERNEL
    pyvmm [OPTIONS] --restore=DIR

Tender options all come before the unikernel path; the first argument that
is not an option (or the one after ``--``) is the unikernel and every
argument after it belongs to the guest, even one starting with ``--``.
An option that takes a value accepts ``--opt=VALUE`` and ``--opt VALUE``,
except an optional value (``--stats[=INTERVAL]``, ``--trace[=FILE]``),
which is only ever ``--opt=VALUE``: the word after ``--stats`` is KERNEL.
Each option may be given once. Every error ends in one line on stderr and
a non-zero exit, never a traceback.

Every option is one entry of ``OPTIONS`` (pyvmm's core) or an ``Option`` of
a device kind (pyvmm.devices); --help, the man page (docs/pyvmm.1) and bash
completion (scripts/pyvmm-completion.bash) are all made from them
(``usage()`` here, pyvmm/command/clidocs.py for the other two).
"""

from __future__ import annotations

import _signal  # signal's constants without the signal module (it imports enum)
import os
import sys

from pyvmm import __version__
from pyvmm.common import stopping, trace
from pyvmm.common.errors import OutputError, PyvmmError, UsageError
from pyvmm.common.values import is_decimal, one_of
from pyvmm.vm.config import DEFAULT_MEM_MIB, VmConfig

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyvmm.devices import DeviceKind, Option

trace.early("imports: command line")

CPL_VALUES = ("auto", "0", "3", "deprivileged")
LOG_LEVELS = ("error", "warning", "info", "debug")
#: --snapshot-at's triggers (pyvmm/vm/snapshot/writer.py).
SNAPSHOT_TRIGGERS = ("first-wait", "sigusr2")
_HELP_COLUMN = 32
#: --help fits a terminal of 80 columns.
HELP_WIDTH = 80


# The classes here are plain ones, not dataclasses: the dataclasses module
# and the code it generates would cost --version and every run milliseconds
# (docs/startup.md).


class Command:
    """What the command line asks for."""

    def __init__(self, config: VmConfig) -> None:
        self.config = config
        #: "run", "help", "version" or "query-manifest".
        self.action = "run"
        self.json = False
        self.log_level = "warning"
        #: --trace: None (off), "" (stderr only) or the JSON file.
        self.trace: str | None = None
        #: setting -> the argument that gave it (each may be given once).
        self.given: dict[tuple[str, str | None], str] = {}
        #: "did you mean --stats=1s?", when KERNEL is a word that follows
        #: an optional-value option and looks like its value (kernel_hint).
        self.kernel_hint: str | None = None


class CliOption:
    """One of pyvmm's own options (device options: pyvmm.devices.Option).

    ``metavar`` empty: a flag without a value. ``optional_value``: the value
    is given only as ``--opt=VALUE`` (``--stats[=INTERVAL]``), and
    ``value_like`` says whether a word could have been meant as one (the
    hint when that word fails as KERNEL). Options with the same ``setting``
    set one thing and may not be combined (``-v`` and ``--quiet``).
    ``complete``: "file", or choices separated by "|". ``query``: the
    option still means something with --query-manifest.
    """

    __slots__ = (
        "names",
        "metavar",
        "help",
        "apply",
        "optional_value",
        "setting",
        "complete",
        "value_like",
        "query",
    )

    def __init__(
        self,
        names: tuple[str, ...],
        metavar: str,
        help: str,
        apply: Callable[[Command, str, str | None], None],
        optional_value: bool = False,
        setting: str = "",
        complete: str = "",
        value_like: Callable[[str], bool] | None = None,
        query: bool = False,
    ) -> None:
        self.names = names
        self.metavar = metavar
        self.help = help
        self.apply = apply
        self.optional_value = optional_value
        self.setting = setting
        self.complete = complete
        self.value_like = value_like
        self.query = query

    def __repr__(self) -> str:
        return f"CliOption({self.form()!r})"

    @property
    def takes_value(self) -> bool:
        return bool(self.metavar)

    @property
    def key(self) -> str:
        return self.setting or self.names[-1]

    def form(self) -> str:
        """How --help and the man page show it: ``-h, --help``, ``--mem=N``."""
        if not self.metavar:
            value = ""
        elif self.optional_value:
            value = f"[={self.metavar}]"
        else:
            value = f"={self.metavar}"
        return ", ".join(self.names) + value


# -- the core options ------------------------------------------------------------


def _set(attr: str, convert: Callable[[str, str], object] | None = None):
    def apply(cmd: Command, name: str, value: str | None) -> None:
        setattr(cmd.config, attr, True if value is None else convert(name, value))

    return apply


def _no_sandbox(cmd: Command, name: str, value: str | None) -> None:
    cmd.config.sandbox = False


def _gdb_port(cmd: Command, name: str, value: str | None) -> None:
    if value is None or not is_decimal(value) or int(value) > 65535:
        raise UsageError(f"{name}: '{value}' is not a port number (0-65535; 0: any free one)")
    cmd.config.gdb = True
    cmd.config.gdb_port = int(value)


def _gdb_socket(cmd: Command, name: str, value: str | None) -> None:
    if not value:
        raise UsageError(f"{name}: the socket's path is empty")
    cmd.config.gdb = True
    cmd.config.gdb_socket = value


def _text(name: str, value: str) -> str:
    return value


def _choice_option(name: str, help: str, attr: str, values: tuple[str, ...]) -> CliOption:
    """An option whose value is one of ``values``: what --help shows,
    what is checked and what the shell completes, from the one tuple."""
    shown = "|".join(values)
    return CliOption((name,), shown, help, _set(attr, one_of(values)), complete=shown)


def _mem(name: str, value: str) -> int:
    if not is_decimal(value) or int(value) <= 0:
        raise UsageError(f"Malformed argument to --mem: '{value}' is not a positive integer")
    return int(value)


def _pin(cmd: Command, name: str, value: str | None) -> None:
    cpus = os.sched_getaffinity(0)
    for part in (value or "").split(","):
        thread, _, cpu = part.partition("=")
        if thread not in ("vcpu", "io") or not (is_decimal(cpu) and len(cpu) <= 6):
            raise UsageError(f"--pin: '{part}' is not vcpu=N or io=N")
        if int(cpu) not in cpus:
            raise UsageError(f"--pin: CPU {cpu} is not available (usable: {sorted(cpus)})")
        setattr(cmd.config, f"pin_{thread}", int(cpu))


def _stats(cmd: Command, name: str, value: str | None) -> None:
    cmd.config.stats = True
    if value is not None:
        from pyvmm.vm.statsview import parse_interval

        cmd.config.stats_interval = parse_interval("--stats", value)


def _an_interval(word: str) -> bool:
    from pyvmm.vm.statsview import parse_interval

    try:
        parse_interval("--stats", word)
    except UsageError:
        return False
    return True


def _stats_json(cmd: Command, name: str, value: str | None) -> None:
    if not value:
        raise UsageError("--stats-json=: missing FILE (or - for stdout)")
    cmd.config.stats_json = value


def _trace(cmd: Command, name: str, value: str | None) -> None:
    if value == "":
        raise UsageError("--trace=: missing FILE (or give --trace alone)")
    cmd.trace = value or ""


def _level(level: str):
    def apply(cmd: Command, name: str, value: str | None) -> None:
        cmd.log_level = level if value is None else one_of(LOG_LEVELS)(name, value)

    return apply


def _log_option(names: tuple[str, ...], metavar: str, help: str, level: str, **more) -> CliOption:
    """A way to set the log level (``level``; "": the value names it): one
    setting however given, and one --query-manifest accepts."""
    return CliOption(names, metavar, help, _level(level), setting="log level", query=True, **more)


def _action(action: str):
    def apply(cmd: Command, name: str, value: str | None) -> None:
        cmd.action = action

    return apply


def _json(cmd: Command, name: str, value: str | None) -> None:
    cmd.json = True


_DEVICES = object()  # where the device kinds' options go in --help

OPTIONS: tuple[CliOption | object, ...] = (
    CliOption(
        ("--mem",),
        "N",
        f"guest memory in MiB (default {DEFAULT_MEM_MIB}), rounded down to\n"
        "a multiple of 2 MiB (with a note on stderr), at most 4096",
        _set("mem_mib", _mem),
    ),
    _DEVICES,
    _choice_option(
        "--cpl",
        "privilege level of the guest: 0 as solo5-hvt;\n"
        "3 (user mode, native speed on PVM hosts) for\n"
        "a guest that declares it; deprivileged runs\n"
        "any other guest at 3, trapping and emulating\n"
        "its privileged instructions; auto picks 3 or\n"
        "deprivileged on a PVM host, else 0 (default)",
        "cpl",
        CPL_VALUES,
    ),
    CliOption(
        ("--legacy-abi",),
        "",
        "also boot unikernels with hvt ABI version 1\n"
        "(built with Solo5 0.9 or older): plain\n"
        "hypercalls, no rings",
        _set("legacy_abi"),
    ),
    CliOption(
        ("--no-sandbox",),
        "",
        "run without the seccomp filter pyvmm puts on\n"
        "itself before the guest starts (debugging;\n"
        "docs/security.md)",
        _no_sandbox,
    ),
    CliOption(
        ("--user",),
        "USER",
        "drop to USER (a name, with its groups, or\n"
        "UID:GID) once every device is open,\nbefore the guest starts",
        _set("user", _text),
    ),
    CliOption(
        ("--dumpcore",),
        "DIR",
        "on a guest fault or solo5_abort(), write an ELF\n"
        "core of the guest to DIR/core.solo5-hvt.PID\n"
        "(solo5-hvt-debug's option; docs/debugging.md)",
        _set("dumpcore", _text),
        complete="file",
    ),
    CliOption(
        ("--gdb",),
        "",
        "wait for gdb on 127.0.0.1:1234 before the guest's\n"
        "first instruction (solo5-hvt-debug's option;\n"
        "docs/debugging.md)",
        _set("gdb"),
    ),
    CliOption(
        ("--gdb-port",),
        "N",
        "--gdb on port N of 127.0.0.1 (0: any free port,\nnamed on stderr)",
        _gdb_port,
    ),
    CliOption(
        ("--gdb-socket",),
        "PATH",
        "--gdb on a new Unix socket at PATH (removed once\ngdb connects)",
        _gdb_socket,
        complete="file",
    ),
    CliOption(
        ("--pin",),
        "vcpu=N,io=M",
        "pin the vCPU thread and/or the IO thread\nto CPUs",
        _pin,
    ),
    _choice_option(
        "--snapshot-at",
        "write a snapshot of the guest to --snapshot-dir\n"
        "when it first waits (its first poll after\n"
        "boot) or when pyvmm gets SIGUSR2, then run on\n"
        "(docs/snapshots.md)",
        "snapshot_at",
        SNAPSHOT_TRIGGERS,
    ),
    CliOption(
        ("--snapshot-dir",),
        "DIR",
        "--snapshot-at: the new directory (owner-only,\nnever an existing one)",
        _set("snapshot_dir", _text),
        complete="file",
    ),
    CliOption(
        ("--snapshot-stop",),
        "",
        "--snapshot-at: end the run (status 0) once the\nsnapshot is written",
        _set("snapshot_stop"),
    ),
    CliOption(
        ("--restore",),
        "DIR",
        "resume the snapshot in DIR instead of a boot:\n"
        "no KERNEL operand; devices attached anew\n"
        "(--net:NAME=TAP, --block:NAME=PATH)",
        _set("restore", _text),
        complete="file",
    ),
    CliOption(
        ("--stats",),
        "INTERVAL",
        "counters on stderr: a summary at exit and, with\n"
        "an interval (1s, 500ms), a table of rates per\n"
        "interval (frames, drops, VM exits, IO thread,\n"
        "CPU), its header repeated; SIGUSR1 prints the\n"
        "counters so far",
        _stats,
        optional_value=True,
        value_like=_an_interval,
    ),
    CliOption(
        ("--stats-json",),
        "FILE",
        "the counters as JSON (docs/stats.md) at exit,\n"
        "and per interval with --stats=INTERVAL; FILE\n"
        "- is standard error (stdout is the guest's\n"
        "console)",
        _stats_json,
        complete="file",
    ),
    CliOption(
        ("--trace",),
        "FILE",
        "the start-up and shut-down timeline on stderr:\n"
        "every phase and its duration, from the\n"
        "process start to its exit; with FILE also in\n"
        "the Trace Event JSON format (Perfetto,\n"
        "chrome://tracing; docs/startup.md)",
        _trace,
        optional_value=True,
        complete="file",
        value_like=lambda word: True,  # any name can be a file's
        query=True,
    ),
    _log_option(
        ("-v", "--verbose"),
        "",
        "say what pyvmm decides and why (log level\n"
        "info): privilege mode, device back ends,\n"
        "memory layout, ring placement",
        "info",
    ),
    _log_option(
        ("-vv",),
        "",
        "also debug: the vCPU's registers when a run\nends in a fault",
        "debug",
    ),
    _log_option(
        ("--log-level",),
        "LEVEL",
        "error, warning (default: only what solo5-hvt\nwould say too), info (-v) or debug (-vv)",
        "",
        complete="|".join(LOG_LEVELS),
    ),
    _log_option(
        ("-q", "--quiet"),
        "",
        "errors only: no warnings, such as the note\nthat --mem was rounded",
        "error",
    ),
    CliOption(
        ("--query-manifest",),
        "",
        "print KERNEL's declared devices, its Solo5 ABI\n"
        "and pyvmm capability notes, and exit (as\n"
        "solo5-elftool query-manifest); any option but\n"
        "--json, --trace and the log levels is refused",
        _action("query-manifest"),
        setting="action",
        query=True,
    ),
    CliOption(
        ("--json",),
        "",
        "--query-manifest: as JSON (solo5-elftool's\nobject, plus pyvmm's facts)",
        _json,
        query=True,
    ),
    CliOption(("-h", "--help"), "", "show this help", _action("help")),
    CliOption(
        ("--version", "--host-info"),
        "",
        "show version and what this host's KVM provides\n"
        "(status 1 when KVM cannot be used here: the\n"
        "version, then why, on stderr)",
        _action("version"),
    ),
)

#: (status, meaning), for --help and the man page.
EXIT_STATUSES = (
    ("0-255", "the guest's: solo5_exit(n), its low 8 bits; 255 for solo5_abort()"),
    (
        "1",
        "pyvmm's own error, one line on stderr starting with 'pyvmm: ' (bad option, kernel or "
        "device, a guest fault, console output that cannot be written; --version where "
        "this host's KVM cannot be used)",
    ),
    ("128+N", "stopped by signal N: 129 SIGHUP, 130 SIGINT, 143 SIGTERM, at any moment"),
)
#: (variable, meaning), for --help and the man page: every variable the
#: pyvmm command reads (tests/test_cli.py looks for others in the source).
ENVIRONMENT = (
    ("PYVMM_DEBUG=1", "show the traceback behind 'pyvmm: internal error' (a pyvmm bug)"),
    ("PYVMM_PY_HYPERCALLS=1", "answer every hypercall in Python instead of in C"),
    (
        "PYVMM_SANDBOX_SELFTEST=1",
        "once the seccomp sandbox is on, try calls it must refuse and say what happened "
        "(docs/security.md)",
    ),
    (
        "PYVMM_IMAGE_SHARING=0",
        "copy the unikernel's pages instead of mapping them from the page cache "
        "(an image on a network file system others may write)",
    ),
    (
        "PYVMM_PYTHON=PATH",
        "the interpreter the pyvmm command (its launcher) starts, instead of the one "
        "pyvmm was built for",
    ),
)


def core_options() -> list[CliOption]:
    return [opt for opt in OPTIONS if isinstance(opt, CliOption)]


class HelpEntry:
    """One line group of --help and one .TP of the man page."""

    __slots__ = ("form", "help", "names", "complete", "takes_value", "optional_value")

    def __init__(
        self,
        form: str,
        help: str,
        names: tuple[str, ...],
        complete: str = "",
        takes_value: bool = False,
        optional_value: bool = False,
    ) -> None:
        self.form = form
        self.help = help
        self.names = names
        self.complete = complete
        self.takes_value = takes_value
        #: The value is only ever given as --opt=VALUE (--stats[=INTERVAL]).
        self.optional_value = optional_value

    def __repr__(self) -> str:
        return f"HelpEntry({self.form!r})"


def device_entries(kind: DeviceKind, opt: Option) -> list[HelpEntry]:
    value = f"={opt.metavar}" if opt.takes_value else ""
    flag = f"--{opt.flag}"
    out = []
    if opt.named:
        out.append(HelpEntry(f"{flag}:NAME{value}", opt.help, (f"{flag}:",), opt.complete, True))
    if opt.short:
        text = (
            f"the same, when the manifest has one {kind.label}\ndevice" if opt.named else opt.help
        )
        out.append(HelpEntry(f"{flag}{value}", text, (flag,), opt.complete, opt.takes_value))
    return out


def help_entries() -> Iterator[HelpEntry]:
    """Every option as --help lists it, in order."""
    from pyvmm.devices import kinds

    for opt in OPTIONS:
        if isinstance(opt, CliOption):
            yield HelpEntry(
                opt.form(), opt.help, opt.names, opt.complete, opt.takes_value, opt.optional_value
            )
        after = opt.names[-1] if isinstance(opt, CliOption) else ""
        for kind in kinds():  # a kind's options listed here (Option.after)
            for device_opt in kind.options:
                if device_opt.after == after:
                    yield from device_entries(kind, device_opt)


def usage() -> str:
    """--help: every option, the exit statuses, the environment."""
    lines = [
        "usage: pyvmm [OPTIONS] [--] KERNEL [ARGS...]",
        "       pyvmm --query-manifest [--json] KERNEL",
        "       pyvmm [OPTIONS] --restore=DIR",
        "       pyvmm serve --api-sock PATH",
        "       pyvmm run --api-sock PATH [OPTIONS] [--] KERNEL [ARGS...]",
        "       pyvmm snapshot --api-sock PATH [--stop] ID DIR",
        "",
        "Run a Solo5 hvt unikernel on KVM. Options (solo5-hvt's, and pyvmm's own):",
    ]
    for item in help_entries():
        lines += _columns(item.form, item.help, _HELP_COLUMN)
    lines += [
        "An option that takes a value accepts --opt=VALUE and --opt VALUE, but an",
        "optional value only --opt=VALUE (--stats=1s, --trace=t.json: after --stats",
        "the next word is KERNEL). Each option may be given once. Everything after",
        "KERNEL is the guest's command line.",
        "",
        "pyvmm serve: a warm launcher: pyvmm imported once, then each VM started",
        "as its own child process on request over the Unix socket PATH (HTTP/JSON,",
        "docs/serve.md). pyvmm run --api-sock PATH: the command through it (the",
        "same options, console and exit status). pyvmm snapshot --api-sock PATH",
        "ID DIR: a snapshot of its running VM ID in the new directory DIR (the guest",
        "runs on; with --stop its VM ends), resumed by pyvmm --restore=DIR or by the",
        "launcher (docs/snapshots.md).",
        "",
        "Exit status:",
    ]
    for status, text in EXIT_STATUSES:
        lines += _columns(status, text, 10)
    lines += ["", "Environment:"]
    column = max(len(name) for name, _ in ENVIRONMENT) + 4
    for name, text in ENVIRONMENT:
        lines += _columns(name, text, column)
    return "\n".join(lines) + "\n"


def _columns(left: str, text: str, column: int) -> list[str]:
    """``left`` indented by 2, ``text`` from ``column`` on, every line at
    most HELP_WIDTH wide: the text's own line breaks are kept where every
    line fits, else the whole text is wrapped anew."""
    width = HELP_WIDTH - column
    body = text.split("\n")
    if max(len(line) for line in body) > width:
        import textwrap

        body = textwrap.wrap(" ".join(text.split()), width)
    first, *rest = body
    if len(left) > column - 3:
        out = [f"  {left}"]
        rest = body
    else:
        out = [f"  {left:<{column - 2}}{first}".rstrip()]
    return out + [" " * column + more for more in rest]


# -- parsing ---------------------------------------------------------------------


def _spellings() -> dict[str, CliOption]:
    return {name: opt for opt in core_options() for name in opt.names}


def all_spellings() -> list[str]:
    """Every option name as typed (device options with their ':')."""
    from pyvmm.devices import option_table

    names = list(_spellings())
    for flag, (_kind, opt) in option_table().items():
        if opt.named:
            names.append(f"--{flag}:")
        if opt.short:
            names.append(f"--{flag}")
    return names


def _invalid(arg: str) -> UsageError:
    head = arg.split("=", 1)[0]
    if head.startswith("--") and ":" in head:
        head = head.split(":", 1)[0] + ":"
    import difflib

    names = all_spellings()
    prefixed = [n for n in names if n.startswith(head) and len(head) >= 3]
    close = prefixed if len(prefixed) == 1 else difflib.get_close_matches(head, names, 1, 0.6)
    hint = ""
    if close:
        hint = f"did you mean {close[0] + 'NAME' if close[0].endswith(':') else close[0]}? "
    return UsageError(f"Invalid option: `{arg}' ({hint}see pyvmm --help)")


def _once(cmd: Command, key: tuple[str, str | None], arg: str, shown: str) -> None:
    first = cmd.given.get(key)
    if first is not None:
        if first.split("=", 1)[0] == arg.split("=", 1)[0]:
            raise UsageError(
                f"{shown} given twice ({first}, then {arg}): each option may be given once"
            )
        raise UsageError(f"{first} and {arg} both set the {key[0]}: give one of them")
    cmd.given[key] = arg


def _check_name(arg: str, name: str) -> None:
    """A device name: 1 to MFT_NAME_MAX of [A-Za-z0-9] (Solo5's manifest limit)."""
    from pyvmm._native import lib  # reached only once a device kind is imported

    if not (0 < len(name) <= lib.MFT_NAME_MAX and name.isascii() and name.isalnum()):
        raise UsageError(
            f"{arg}: invalid device name '{name}' (1-{lib.MFT_NAME_MAX} of [A-Za-z0-9])"
        )


def _device_options(devices: dict) -> dict:
    """Fill ``devices`` with the device kinds' options (importing the
    kinds: a command without device options never does)."""
    from pyvmm.devices import option_table

    devices.update(option_table())
    return devices


def parse_command(argv: list[str]) -> Command:
    cmd = Command(VmConfig(kernel="", sandbox=True))  # the command sandboxes itself
    core = _spellings()
    devices: dict = {}  # the device kinds' options, imported at the first one
    # (index of the word after an optional-value option, the hint for it)
    maybe_value: tuple[int, str] | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        head, eq, value = arg.partition("=")
        given_value: str | None = value if eq else None
        if head in core:
            opt = core[head]
            shown = head
            if opt.takes_value and given_value is None and not opt.optional_value:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{head}: missing value ({head}={opt.metavar})")
                given_value = argv[i]
                arg = f"{head}={given_value}"
            elif not opt.takes_value and given_value is not None:
                raise UsageError(f"{head} takes no value (given: {arg})")
            elif opt.value_like is not None and given_value is None and i + 1 < len(argv):
                word = argv[i + 1]
                if not word.startswith("-") and opt.value_like(word):
                    maybe_value = (i + 1, f"did you mean {head}={word}?")
            _once(cmd, (opt.key, None), arg, shown)
            opt.apply(cmd, head, given_value)
            if cmd.action in ("help", "version"):
                return cmd
        elif head.startswith("--") and head[2:].partition(":")[0] in (
            devices or _device_options(devices)
        ):
            flag, colon, name = head[2:].partition(":")
            _kind, opt = devices[flag]
            if colon and not opt.named or not colon and not opt.short:
                raise _invalid(arg)
            if colon:
                _check_name(arg, name)
            if opt.takes_value and given_value is None:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{head}: missing value ({head}={opt.metavar})")
                given_value = argv[i]
                arg = f"{head}={given_value}"
            elif not opt.takes_value and given_value is not None:
                raise UsageError(f"{head} takes no value (given: {arg})")
            if opt.takes_value and not given_value and opt.named:
                raise UsageError(f"{arg}: missing {opt.metavar} after '='")
            _once(cmd, (head, None), arg, head)
            value = opt.parse(head, given_value) if opt.takes_value else True
            cmd.config.devices.setdefault(flag, {})[name if colon else None] = value
        else:
            raise _invalid(arg)
        i += 1
    if cmd.config.restore is not None:
        _check_restore(cmd, argv[i:])
        return cmd
    if i >= len(argv):
        raise UsageError("Missing KERNEL operand (see pyvmm --help)")
    cmd.config.kernel = argv[i]
    cmd.config.guest_args = argv[i + 1 :]
    _check_snapshot(cmd.config)
    if maybe_value is not None and maybe_value[0] == i:
        cmd.kernel_hint = maybe_value[1]
    if cmd.json and cmd.action != "query-manifest":
        raise UsageError("--json applies only to --query-manifest")
    if cmd.action == "query-manifest":
        _only_query_options(cmd, core)
    if devices:  # the kinds' own checks of their options (imported: some were given)
        from pyvmm.devices import kinds

        for kind in kinds():
            kind.check_options(cmd.config.devices)
    return cmd


def _check_snapshot(config: VmConfig) -> None:
    """--snapshot-dir and --snapshot-stop go with --snapshot-at, and it with a directory."""
    if config.snapshot_at is None:
        if config.snapshot_dir is not None or config.snapshot_stop:
            given = "--snapshot-dir" if config.snapshot_dir is not None else "--snapshot-stop"
            raise UsageError(f"{given} applies only with --snapshot-at")
    elif not config.snapshot_dir:
        raise UsageError("--snapshot-at: missing --snapshot-dir=DIR (where to write it)")


def _check_restore(cmd: Command, rest: list[str]) -> None:
    """--restore takes no KERNEL (the snapshot names it) and no run's set-up
    that the snapshot fixes."""
    if rest:
        raise UsageError(
            f"--restore: the unikernel and its arguments come from the snapshot "
            f"(given: {' '.join(rest)})"
        )
    if cmd.action == "query-manifest" or cmd.config.snapshot_at is not None:
        raise UsageError("--restore: not with --query-manifest or --snapshot-at")
    _check_snapshot(cmd.config)
    for arg in cmd.given.values():
        if arg.partition("=")[0] in ("--mem", "--cpl", "--legacy-abi", "--no-net-ring"):
            raise UsageError(f"{arg}: a restored guest keeps the snapshot's (leave it out)")


def _only_query_options(cmd: Command, core: dict[str, CliOption]) -> None:
    """--query-manifest reads KERNEL's notes and runs nothing: an option
    about a run would be ignored, so it is refused instead."""
    if cmd.config.guest_args:
        raise UsageError(
            f"--query-manifest takes only KERNEL (options go before it; "
            f"given after it: {' '.join(cmd.config.guest_args)})"
        )
    for arg in cmd.given.values():
        opt = core.get(arg.partition("=")[0])
        if opt is None or not opt.query:
            raise UsageError(
                f"{arg} has no effect with --query-manifest (it reads KERNEL's notes and "
                "runs nothing): leave it out"
            )


def kernel_hint(cmd: Command, err: PyvmmError) -> str:
    """``err``'s line, with "did you mean --stats=1s?" when KERNEL failed as
    a kernel and was the word after an optional-value option (whose value
    is only ever given with '=')."""
    text = str(err)
    if cmd.kernel_hint and text.startswith(f"{cmd.config.kernel}: "):
        from pyvmm.common.errors import LoaderError

        if isinstance(err, LoaderError):
            return f"{text} ({cmd.kernel_hint})"
    return text


def parse_args(argv: list[str]) -> VmConfig | str:
    """A VmConfig, or the action ("help", "version", "query-manifest")."""
    cmd = parse_command(argv)
    return cmd.config if cmd.action == "run" else cmd.action


# -- the other actions -----------------------------------------------------------


class NoHostFacts(PyvmmError):
    """--version where this host's KVM cannot be used: the version was
    printed, the host's facts cannot be (status 1, the reason on stderr)."""


def version_text() -> tuple[str, NoHostFacts | None]:
    """Our version, the ABI, and what this host's KVM provides; or, where
    KVM cannot be used, the version and what stands in the way."""
    lines = [f"pyvmm {__version__} (Solo5 hvt ABI 2)"]
    try:
        from pyvmm.command.hostinfo import host_info
        from pyvmm.kvm import System

        with System() as kvm:
            info = host_info(kvm)
    except PyvmmError as err:
        return lines[0], NoHostFacts(
            f"no host facts: KVM cannot be used by this process (nor can guests run): {err}"
        )

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
        f"read-only memslots: {yes(info.readonly_mem)}, "
        + ("TSC" if info.machine == "x86_64" else "timer")
        + f": {tsc}",
        *([", ".join(info.arch_features)] if info.arch_features else []),
        "--cpl=auto runs "
        + (
            "user-mode capable guests at CPL 3, others deprivileged (CPL 3, trap and emulate)"
            if info.flavour == "pvm"
            else "guests at CPL 0"
        ),
    ]
    return "\n".join(lines), None


def _emit(text: str) -> None:
    """``text`` on stdout, or OutputError (stdout closed, full, gone)."""
    data = text.encode()
    try:
        while data:
            data = data[os.write(1, data) :]
    except OSError as err:
        raise OutputError(f"cannot write to standard output: {err.strerror or err}") from None


def main(argv: list[str] | None = None) -> int:
    """The command's exit status, its errors told as pyvmm.common.stopping says
    (its ``serve`` and ``run`` subcommands are pyvmm.serve's: pyvmm.entry
    chooses)."""
    argv = sys.argv[1:] if argv is None else argv
    # SIGUSR1 asks a running guest's counters (statsview.py); before the
    # guest runs there are none to print, and it must not kill pyvmm.
    _signal.signal(_signal.SIGUSR1, _signal.SIG_IGN)
    parsed: list[Command] = []

    def explain(err: PyvmmError) -> str:
        return kernel_hint(parsed[0], err) if parsed else str(err)

    return stopping.contained(lambda: _command(argv, parsed), explain)


def _command(argv: list[str], parsed: list[Command]) -> int:
    """What the command line asks for, done; the command parsed into ``parsed``."""
    stopping.standard_fds()
    cmd = parse_command(argv)
    parsed.append(cmd)
    trace.early("argument parsing")
    if cmd.trace is not None:
        try:
            trace.enable(cmd.trace)
        except OSError as err:
            raise UsageError(f"--trace: cannot create {cmd.trace}: {err.strerror}") from None
    if cmd.action == "help":
        _emit(usage())
        return 0
    if cmd.action == "version":
        text, unavailable = version_text()
        trace.mark("host facts (/dev/kvm, a throw-away VM and vCPU)")
        _emit(text + "\n")
        if unavailable is not None:
            raise unavailable
        return 0
    stopping.defer_logging(cmd.log_level)
    if cmd.action == "query-manifest":
        from pyvmm.command.query import query_manifest

        _emit(query_manifest(cmd.config.kernel, as_json=cmd.json, legacy=True))
        return 0
    from pyvmm.vm.vmm import run

    trace.mark("imports: VMM")
    stopping.check()
    return run(cmd.config)

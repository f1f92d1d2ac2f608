"""pyvmm-oci: the part of runc's command line containerd's runc shim uses.

    pyvmm-oci [--root DIR] [--log FILE] [--log-format text|json] [--debug]
              [--systemd-cgroup] COMMAND ...

    create --bundle DIR --pid-file FILE [--console-socket SOCK] ID
    start ID
    state ID
    kill [--all] ID [SIGNAL]
    delete [--force] ID
    ps [--format json] ID
    features, --version
    pack ...        (pyvmm.oci.image: a unikernel into an OCI image archive)

``create`` forks the container's process, which is pyvmm: the child (the
"init", whose pid goes to the pid file) sets up its namespaces and stdio
and blocks opening ``exec.fifo`` in the state directory for writing, as
runc's init does; ``create`` returns, and the shim (a child subreaper)
inherits the child. ``start`` opens the FIFO for reading and takes one
byte: the child continues and execs ``pyvmm ... KERNEL ARGS`` (its launcher)
under the same pid, with the descriptors of the unikernel and its disks
that ``create`` opened inside the rootfs (pyvmm.oci.rootfs), so the shim
reaps pyvmm itself (its exit status is the guest's, 128 + N after a stop
signal) and its stdout/stderr are the container's. ``state`` says
``created`` while the FIFO exists and the process lives, ``running`` after
``start``, ``stopped`` once it is gone.

State lives in ``ROOT/ID/state.json`` (ROOT: ``--root``, default
/run/pyvmm-oci), readable by root only (0600 in a 0700 directory, as every
file pyvmm-oci writes); an ID is what runc accepts (letters, digits and
``_+,-.``), not starting with a dot, so no command reaches ``ROOT/.runc``,
where runc keeps the pod sandboxes. Errors are one line on stderr and,
with ``--log``, a ``{"level": "error", "msg": ...}`` line in the log,
where the shim looks for the reason of a failed command. ``PYVMM_OCI_TRACE=FILE`` appends every
invocation's argv to FILE. The annotation ``org.pyvmm.trace=DIR`` (or
``PYVMM_OCI_TIMELINE=DIR`` for every container) asks for the container's
start-up timeline, its calls and the VM's phases in DIR/ID.trace.json
(pyvmm.oci.timeline).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time

from pyvmm import __version__
from pyvmm.oci import cgroups, netargs, timeline
from pyvmm.oci.bundle import (
    NET_ARGS,
    BundleError,
    Unikernel,
    load_config,
    read_bundle,
    rootfs_of,
)

PROG = "pyvmm-oci"
DEFAULT_ROOT = "/run/pyvmm-oci"
OCI_VERSION = "1.0.2"
START_TIMEOUT = 30.0
#: runc's rule for an id (letters, digits, ``_+,-.``), and no leading dot:
#: ``ROOT/.runc`` is where the pod sandboxes handed to runc keep their state.
CONTAINER_ID = re.compile(r"[A-Za-z0-9_+,\-][A-Za-z0-9_+,.\-]*")
ID_MAX = 255  # one directory name
#: The native front end's summary of a container (csrc/oci_front.c).
NATIVE_FILE = "native"
NATIVE_MAGIC, NATIVE_VERSION = "pyvmm-oci-native", 1
FILE_MODE = 0o600  # everything pyvmm-oci writes: state, pid file, logs
DIR_MODE = 0o700


class Namespace:
    """A parsed command line's values, as argparse's Namespace holds them
    (the commands take either: quick_create makes this one)."""

    def __init__(self, **values) -> None:
        self.__dict__.update(values)


class RuntimeError_(Exception):
    """Refused command (one line for the user)."""


def check_id(cid: str) -> str:
    """A container id runc would take, that names no hidden directory."""
    if len(cid) > ID_MAX or not CONTAINER_ID.fullmatch(cid):
        shown = cid if len(cid) <= 80 and cid.isprintable() else repr(cid[:80])[1:-1] + "..."
        raise RuntimeError_(
            f"invalid container id {shown!r}: letters, digits and _+,-. only, "
            f"not starting with a dot, at most {ID_MAX} characters"
        )
    return cid


def open_private(path: str, flags: int) -> int:
    """A file only root reads (0600), whatever the umask left it."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_private(path: str, line: str) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_private(path: str, data: str) -> None:
    """Replace ``path`` at once (a temporary file renamed over it)."""
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = open_private(tmp, os.O_WRONLY | os.O_EXCL)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def utc_now() -> str:
    """Now as datetime's isoformat() in UTC, without importing datetime
    (create's start-up: docs/orchestration.md)."""
    now = time.time()
    whole = int(now)
    micro = min(999999, int((now - whole) * 1e6))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{micro:06d}+00:00"


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# -- logging -------------------------------------------------------------


class Log:
    def __init__(self, path: str | None, fmt: str) -> None:
        self.path, self.fmt = path, fmt

    def write(self, level: str, msg: str) -> None:
        if not self.path:
            return
        now = utc_now()
        if self.fmt == "json":
            line = json.dumps({"level": level, "msg": msg, "time": now})
        else:
            line = f'time="{now}" level={level} msg="{msg}"'
        with contextlib.suppress(OSError):
            append_private(self.path, line + "\n")


# -- state ---------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time): tells a pid's reuse apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # a zombie has finished: it only waits for the shim to reap it
    return fields[19]


class Container:
    def __init__(self, root: str, cid: str) -> None:
        self.id = check_id(cid)
        self.dir = os.path.join(root, cid)
        self.state_file = os.path.join(self.dir, "state.json")
        self.fifo = os.path.join(self.dir, "exec.fifo")

    def exists(self) -> bool:
        return os.path.isfile(self.state_file)

    def load(self) -> dict:
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except FileNotFoundError:
            raise RuntimeError_(f"container {self.id} does not exist") from None

    def save(self, state: dict) -> None:
        write_private(self.state_file, json.dumps(state))

    def alive(self, state: dict) -> bool:
        pid = state.get("pid") or 0
        return pid > 0 and _start_time(pid) == state.get("start_time")

    def status(self, state: dict) -> str:
        if not self.alive(state):
            return "stopped"
        return "created" if os.path.exists(self.fifo) else "running"

    def save_native(self, state: dict) -> None:
        """ROOT/ID/native: what the native front end (csrc/oci_front.c)
        needs to answer state, start, kill and delete without Python."""
        lines = [
            f"{NATIVE_MAGIC} {NATIVE_VERSION}",
            f"pid {state['pid']} {state['start_time']}",
            f"net {1 if state.get('link') else 0}",
        ]
        cgroup = state.get("cgroup") or {"dirs": {}, "made": []}
        lines += [f"leaf {d}" for d in sorted(set(cgroup["dirs"].values()))]
        lines += [f"made {d}" for d in cgroup["made"]]
        if state.get("warm"):  # the VM, which SIGKILL reaches past its relay
            lines.append(f"vm {state['warm']['pid']} {state['warm']['start_time']}")
        if any("\n" in line for line in lines) or state["start_time"] is None:
            return  # (a path with a newline in it): every call goes to Python
        lines.append("state " + json.dumps(_state_json(state, None)))
        write_private(os.path.join(self.dir, NATIVE_FILE), "\n".join(lines) + "\n")


# -- create ----------------------------------------------------------------


def _send_console(sock_path: str) -> int:
    """A new pty: its master goes to the console socket; the slave fd back."""
    import array
    import socket

    master, slave = os.openpty()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(sock_path)
            fds = array.array("i", [master])
            sock.sendmsg([b"/dev/ptmx"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    finally:
        os.close(master)
    return slave


def pyvmm_command() -> list[str]:
    """The pyvmm command: its native launcher (docs/startup.md: a lean
    start, and no window in which a stop signal meets a half-started
    interpreter), or this interpreter where the launcher was not built."""
    launcher = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_launcher")
    if os.access(launcher, os.X_OK):
        return [launcher]
    return [sys.executable, "-m", "pyvmm"]


def pyvmm_argv(
    kernel: Unikernel,
    tap: str | None,
    mac: str | None,
    verbose: bool = False,
    trace: str | None = None,
) -> list[str]:
    argv = pyvmm_command()
    if verbose:
        argv.append("-v")
    if trace is not None:  # the VM's phases, for the container's timeline
        argv.append(f"--trace={trace}")
    if kernel.mem_mib is not None:
        argv.append(f"--mem={kernel.mem_mib}")
    pin = kernel.resources.pin()
    if pin is not None:  # the cgroup's cpuset: the vCPU and IO threads inside it
        argv.append(f"--pin=vcpu={pin[0]},io={pin[1]}")
    if tap is not None:
        name = kernel.net_devices[0]
        argv += [f"--net:{name}={tap}", f"--net-mac:{name}={mac}"]
    for name, block in sorted(kernel.blocks.items()):
        argv.append(f"--block:{name}=@{block.fd}")
    if kernel.user is not None:  # process.user: the VM runs on as it once its devices are open
        argv.append("--user={}:{}".format(*kernel.user))
    return [*argv, "--", kernel.path, *kernel.args]


def _child(
    fifo: str, argv: list[str], console: int | None, new_netns: bool, fds: list[int]
) -> None:
    """The container's process until start: never returns. ``fds`` (the
    unikernel and its block files) go through the exec to pyvmm."""
    try:
        for fd in fds:
            os.set_inheritable(fd, True)
        os.setsid()
        if console is not None:
            import fcntl
            import termios

            for fd in (0, 1, 2):
                os.dup2(console, fd)
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if new_netns:
            from pyvmm.host.netns import unshare

            unshare()
        # Blocks until start opens the FIFO for reading.
        fd = os.open(fifo, os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, b"0")
        os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(argv[0], argv)
    except BaseException as err:
        with contextlib.suppress(BaseException):
            os.write(2, f"pyvmm-oci: cannot start the unikernel: {err}\n".encode())
        os._exit(127)


def create(root: str, args: Namespace) -> None:
    bundle = os.path.abspath(args.bundle)
    container = Container(root, args.id)
    if os.path.exists(container.dir):
        raise RuntimeError_(f"container {args.id} already exists")
    try:
        config = load_config(bundle)
        kernel = read_bundle(bundle, config)
        args.timeline = timeline.requested(config.get("annotations"))
    except (BundleError, timeline.TimelineError) as err:
        raise RuntimeError_(str(err)) from err
    with kernel:  # this process's copies of the descriptors: pyvmm has its own
        _create(container, bundle, config, kernel, args)


def new_state(cid: str, bundle: str, config: dict, kernel: Unikernel) -> dict:
    """A created container's state.json, before its process exists (the
    cold create's and the warm launcher's alike)."""
    return {
        "id": cid,
        "pid": 0,
        "bundle": bundle,
        "rootfs": rootfs_of(bundle, config),
        "created": utc_now(),
        "annotations": kernel.annotations,
        "netns": kernel.netns,
        "link": None,
        "cgroup": None,
    }


def _create(
    container: Container, bundle: str, config: dict, kernel: Unikernel, args: Namespace
) -> None:
    os.mkdir(container.dir, DIR_MODE)
    state = new_state(args.id, bundle, config, kernel)
    container.save(state)
    console = None
    try:
        if args.timeline is not None:
            timeline.start(container.dir, timeline.destination(args.timeline, args.id))
        try:
            path = cgroups.spec_path(kernel.cgroups_path, args.id, args.systemd_cgroup)
            cgroup = cgroups.create(path, kernel.resources)
        except cgroups.CgroupError as err:
            raise RuntimeError_(str(err)) from None
        state["cgroup"] = cgroup.to_state()
        container.save(state)
        tap = mac = None
        if kernel.net_devices:
            try:
                from pyvmm.oci import network  # (pyroute2: only for a guest with a net device)

                link = network.setup(kernel.netns, args.id)
            except Exception as err:  # pyroute2's NetlinkError is no OSError
                raise RuntimeError_(f"container network: {err}") from err
            state["link"] = link.to_state()
            container.save(state)
            tap, mac = link.tap, link.mac
            if kernel.net_template is not None:
                try:
                    words = netargs.fill(kernel.net_template, link.values())
                except netargs.TemplateError as err:
                    raise RuntimeError_(f"{NET_ARGS}: bad template: {err}") from None
                kernel.args = words + kernel.args
        argv = pyvmm_argv(
            kernel, tap, mac, verbose=args.debug, trace=timeline.vm_trace(container.dir)
        )
        os.mkfifo(container.fifo, 0o600)
        if args.console_socket:
            console = _send_console(args.console_socket)
        enter = contextlib.nullcontext()
        if kernel.netns:
            from pyvmm.host.netns import inside_path

            enter = inside_path(kernel.netns)
        with enter:  # the child is born in the container's network namespace
            pid = os.fork()
            if pid == 0:
                _child(container.fifo, argv, console, kernel.new_netns, kernel.fds())
        state["pid"] = pid
        state["start_time"] = _start_time(pid)
        state["argv"] = argv
        container.save(state)
        try:  # before exec: every thread pyvmm starts is born in the cgroup
            cgroup.join(pid)
        except cgroups.CgroupError as err:
            raise RuntimeError_(str(err)) from None
        if args.debug:
            args.logger.write("debug", f"cgroup {path} ({', '.join(cgroup.leaves())}); {argv}")
        container.save_native(state)
        if args.pid_file:
            write_private(args.pid_file, str(pid))
    except BaseException:
        _remove(container, state, kill=True)
        raise
    finally:
        if console is not None:
            os.close(console)


# -- the other commands ----------------------------------------------------


def start(root: str, args: Namespace) -> None:
    container = Container(root, args.id)
    state = container.load()
    status = container.status(state)
    if status != "created":
        raise RuntimeError_(f"cannot start a container that is {status}")
    import select

    fd = os.open(container.fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready and os.read(fd, 1):
                break
            if not container.alive(state):
                raise RuntimeError_("the container's process ended before it started")
            if time.monotonic() > deadline:
                raise RuntimeError_("the container's process did not take the start signal")
    finally:
        os.close(fd)
    os.unlink(container.fifo)


def _state_json(state: dict, status: str | None) -> dict:
    """runc's state output (without pid and status when ``status`` is None:
    the native front end adds them)."""
    out = {"ociVersion": OCI_VERSION, "id": state["id"]}
    if status is not None:
        out.update(pid=state["pid"] if status != "stopped" else 0, status=status)
    out.update(
        bundle=state["bundle"],
        rootfs=state["rootfs"],
        created=state["created"],
        owner="",
        annotations=state.get("annotations") or {},
    )
    return out


def state_cmd(root: str, args: Namespace) -> None:
    container = Container(root, args.id)
    state = container.load()
    print(json.dumps(_state_json(state, container.status(state)), indent=2))


def parse_signal(text: str) -> int:
    if text.isdecimal():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise RuntimeError_(f"unknown signal {text!r}") from None


def kill(root: str, args: Namespace) -> None:
    container = Container(root, args.id)
    state = container.load()
    signum = parse_signal(args.signal)
    if not container.alive(state):
        raise RuntimeError_("container not running")
    try:
        os.kill(state["pid"], signum)
    except ProcessLookupError:
        raise RuntimeError_("container not running") from None
    warm = state.get("warm")  # the warm path's relay passes every signal on but this one
    if warm and signum == signal.SIGKILL and _start_time(warm["pid"]) == warm["start_time"]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(warm["pid"], signum)
    if args.all and state.get("cgroup"):  # runc's --all: every process in the cgroup
        cgroups.Cgroup.from_state(state["cgroup"]).signal_all(signum)


def _remove(container: Container, state: dict, kill: bool) -> str | None:
    """Kill, and remove what create made: the cgroup (whatever is still in
    it killed too), the network, the state. A cgroup that cannot be
    removed keeps the state, so a later delete tries again; its reason is
    returned."""
    if kill and container.alive(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"], signal.SIGKILL)
    failed = None
    if state.get("cgroup"):
        cgroup = cgroups.Cgroup.from_state(state["cgroup"])
        if kill:
            cgroup.signal_all(signal.SIGKILL)
        try:
            cgroup.remove()
        except cgroups.CgroupError as err:
            failed = str(err)
    if state.get("link") and state.get("netns"):
        with contextlib.suppress(Exception):
            from pyvmm.oci import network

            network.teardown(state["netns"], state["link"])
        state["link"] = None
    if failed is not None:
        with contextlib.suppress(OSError):
            container.save(state)
        return failed
    _rmtree(container.dir)
    return None


def delete(root: str, args: Namespace) -> None:
    container = Container(root, args.id)
    if not container.exists():
        if os.path.isdir(container.dir):  # a create that died half-way
            _rmtree(container.dir)
            return
        raise RuntimeError_(f"container {args.id} does not exist")
    state = container.load()
    status = container.status(state)
    if status == "running" and not args.force:
        raise RuntimeError_("cannot delete a running container (use --force)")
    pending = timeline.collect(container.dir)  # before the state goes
    failed = _remove(container, state, kill=True)
    if failed is not None:
        raise RuntimeError_(failed)
    if pending is not None:
        timeline.write(pending, "delete", args.call_begin, 0)


def ps(root: str, args: Namespace) -> None:
    container = Container(root, args.id)
    state = container.load()
    pids = [state["pid"]] if container.alive(state) else []
    print(json.dumps(pids) if args.format == "json" else "\n".join(map(str, ["PID", *pids])))


def unsupported(what: str):
    def refuse(root: str, args: Namespace) -> None:
        raise RuntimeError_(f"{what} is not supported by pyvmm-oci (a unikernel is one process)")

    return refuse


def feature_set() -> dict:
    """What ``features`` says, each claim what the code does
    (docs/orchestration.md, "Supported and not"): no hooks and no mounts
    (a bind mount only names a disk's source); of the namespaces only the
    network one means something to a VM; cgroups v1 and v2, and the
    systemd driver's paths (no transient unit is asked for); the spec's
    seccomp, AppArmor, SELinux and RDT do not apply (pyvmm installs its
    own filter). The annotations that change what runs are listed as
    such: pyvmm's own (the unikernel, its disks, the warm launcher, the
    trace) and urunc's."""
    return {
        "ociVersionMin": "1.0.0",
        "ociVersionMax": OCI_VERSION,
        "hooks": [],
        "mountOptions": [],
        "linux": {
            "namespaces": ["network"],
            "capabilities": [],
            "cgroup": {
                "v1": True,
                "v2": True,
                "systemd": True,
                "systemdUser": False,
                "rdma": False,
            },
            "seccomp": {"enabled": False},
            "apparmor": {"enabled": False},
            "selinux": {"enabled": False},
            "intelRdt": {"enabled": False},
        },
        "annotations": {"org.pyvmm.runtime": "pyvmm-oci", "org.pyvmm.version": __version__},
        "potentiallyUnsafeConfigAnnotations": ["org.pyvmm.", "com.urunc.unikernel."],
    }


def features(root: str, args: Namespace) -> None:
    print(json.dumps(feature_set(), indent=2))


# -- command line -----------------------------------------------------------

UNSUPPORTED = ("exec", "pause", "resume", "checkpoint", "restore", "update", "events", "run")


COMMANDS = ("create", "start", "state", "kill", "delete", "ps", "features", "pack")


def parser() -> argparse.ArgumentParser:  # noqa: F821 (imported inside)
    """The whole command line. argparse is imported, and the parser built,
    only here: the shim's create does without both (quick_create)."""
    import argparse

    class _Parser(argparse.ArgumentParser):
        """argparse, with its complaints in one line."""

        def error(self, message: str) -> None:  # type: ignore[override]
            if "invalid choice" in message:  # argparse would list the unsupported verbs too
                message = message.split(" (choose from")[0]
                message += f" (the commands: {', '.join(COMMANDS)})"
            self.exit(2, f"{PROG}: {message} (see {PROG} --help)\n")

    p = _Parser(
        prog=PROG,
        usage=f"{PROG} [--root DIR] [--log FILE] [--log-format text|json] COMMAND ...",
        description=(
            "An OCI runtime with runc's command line that runs Solo5 hvt unikernels with pyvmm: "
            "containerd's io.containerd.runc.v2 shim calls it in place of runc "
            "(docs/orchestration.md)."
        ),
        epilog=(
            "--systemd-cgroup reads cgroupsPath as slice:prefix:name; --debug adds pyvmm's -v "
            "and a debug line in the log. runc's --rootless and --criu are accepted and ignored. "
            "Not supported (a unikernel is one process): " + ", ".join(UNSUPPORTED) + "."
        ),
    )
    p.add_argument("--root", default=DEFAULT_ROOT, metavar="DIR", help="state directory")
    p.add_argument("--log", metavar="FILE", help="append errors to FILE (the shim reads them)")
    p.add_argument(
        "--log-format", default="text", choices=("text", "json"), metavar="FMT", help="text or json"
    )
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--systemd-cgroup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rootless", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--criu", help=argparse.SUPPRESS)
    p.add_argument("-v", "--version", action="store_true", help="pyvmm's version, the OCI spec's")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    c = sub.add_parser("create", help="read the bundle, open its files, wait for start")
    c.add_argument("--bundle", "-b", default=".", metavar="DIR")
    c.add_argument("--pid-file", metavar="FILE")
    c.add_argument("--console-socket", metavar="SOCK")
    c.add_argument("--no-pivot", action="store_true", help=argparse.SUPPRESS)
    c.add_argument("--no-new-keyring", action="store_true", help=argparse.SUPPRESS)
    c.add_argument("--preserve-fds", type=int, default=0, help=argparse.SUPPRESS)
    c.add_argument("id")
    c.set_defaults(run=create)
    for name, func, what in (
        ("start", start, "let a created container's unikernel run"),
        ("state", state_cmd, "the container's state, as runc's JSON"),
    ):
        s = sub.add_parser(name, help=what)
        s.add_argument("id")
        s.set_defaults(run=func)
    k = sub.add_parser("kill", help="send the unikernel's pyvmm a signal (default SIGTERM)")
    k.add_argument("--all", "-a", action="store_true")
    k.add_argument("id")
    k.add_argument("signal", nargs="?", default="SIGTERM")
    k.set_defaults(run=kill)
    d = sub.add_parser("delete", help="remove a stopped container (--force: any)")
    d.add_argument("--force", "-f", action="store_true")
    d.add_argument("id")
    d.set_defaults(run=delete)
    s = sub.add_parser("ps", help="the container's process (pyvmm): a table or JSON")
    s.add_argument("--format", "-f", default="table", choices=("table", "json"))
    s.add_argument("id")
    s.add_argument("ps_args", nargs="*", help=argparse.SUPPRESS)
    s.set_defaults(run=ps)
    f = sub.add_parser("features", help="what this runtime supports, as JSON")
    f.set_defaults(run=features)
    # pack takes its own arguments (pyvmm.oci.image's): main hands them over.
    sub.add_parser("pack", add_help=False, help="pack a unikernel into an OCI image archive")
    for name in UNSUPPORTED:  # no help: not listed, refused with a reason
        u = sub.add_parser(name)
        u.add_argument("rest", nargs=argparse.REMAINDER)
        u.set_defaults(run=unsupported(name))
    return p


#: The shim's create: global options, then create's (name: attribute, a flag?).
QUICK_GLOBALS = {
    "--root": ("root", False),
    "--log": ("log", False),
    "--log-format": ("log_format", False),
    "--rootless": ("rootless", False),
    "--criu": ("criu", False),
    "--debug": ("debug", True),
    "--systemd-cgroup": ("systemd_cgroup", True),
}
QUICK_CREATE = {
    "--bundle": ("bundle", False),
    "-b": ("bundle", False),
    "--pid-file": ("pid_file", False),
    "--console-socket": ("console_socket", False),
    "--no-pivot": ("no_pivot", True),
    "--no-new-keyring": ("no_new_keyring", True),
}


def quick_create(argv: list[str]) -> Namespace | None:
    """``create`` in the plain forms containerd's shim uses, read without
    argparse (importing it and building the parser cost create ~10 ms), as
    the parser would read it; None for anything else, which goes to the
    parser. tests/unit/test_oci_quick_create.py holds both to one reading."""
    values: dict = {
        "root": DEFAULT_ROOT,
        "log": None,
        "log_format": "text",
        "debug": False,
        "systemd_cgroup": False,
        "rootless": "auto",
        "criu": None,
        "version": False,
        "command": "create",
        "bundle": ".",
        "pid_file": None,
        "console_socket": None,
        "no_pivot": False,
        "no_new_keyring": False,
        "preserve_fds": 0,
        "id": None,
    }
    options, i = QUICK_GLOBALS, 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if options is QUICK_GLOBALS and arg == "create":
            options = QUICK_CREATE
        elif name in options and options[name][1]:
            if eq:
                return None
            values[options[name][0]] = True
        elif name in options:
            if not eq:
                i += 1
                if i == len(argv):
                    return None
                value = argv[i]
            if not value or value.startswith("-"):
                return None
            values[options[name][0]] = value
        elif options is QUICK_CREATE and values["id"] is None and arg[:1] not in ("", "-"):
            values["id"] = arg
        else:
            return None
        i += 1
    if options is not QUICK_CREATE or values["id"] is None:
        return None
    if values["log_format"] not in ("text", "json"):
        return None
    return Namespace(run=create, **values)


# -- Kubernetes pod sandboxes: runc's business --------------------------------

RUNC_DIR = ".runc"
SANDBOX_KEYS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType")


def _is_sandbox(args: Namespace) -> bool:
    """A pod's pause container (CRI marks it in the spec's annotations)."""
    if args.command != "create":
        return False
    try:
        annotations = load_config(os.path.abspath(args.bundle)).get("annotations")
    except BundleError:
        return False
    if not isinstance(annotations, dict):  # (read_bundle says what is wrong with it)
        return False
    return any(annotations.get(key) == "sandbox" for key in SANDBOX_KEYS)


def delegate(argv: list[str], args: Namespace) -> None:
    """Run this command with runc, its state under ROOT/.runc: a pod's pause
    container, and every later command about it, go to runc (as urunc does).
    The native front end applies the same rule itself (csrc/oci_runc.h)."""
    import shutil

    runc = shutil.which(os.environ.get("PYVMM_OCI_RUNC", "runc"))
    if runc is None:
        raise RuntimeError_("a pod sandbox container needs runc, which is not installed")
    i = argv.index(args.command)
    globals_, skip = [], False
    for arg in argv[:i]:  # every global option but --root, which becomes ROOT/.runc
        if not skip and arg != "--root" and not arg.startswith("--root="):
            globals_.append(arg)
        skip = not skip and arg == "--root"
    globals_ = ["--root", os.path.join(args.root, RUNC_DIR), *globals_]
    os.execv(runc, [runc, *globals_, *argv[i:]])


def _delegated(args: Namespace) -> bool:
    cid = getattr(args, "id", None)
    return bool(cid) and os.path.isdir(os.path.join(args.root, RUNC_DIR, cid))


def main(argv: list[str] | None = None) -> int:
    begin, main_ns = timeline.call_begin(), timeline.monotonic_ns()
    argv = sys.argv[1:] if argv is None else argv
    trace = os.environ.get("PYVMM_OCI_TRACE")
    if trace:
        with contextlib.suppress(OSError):
            append_private(trace, f"{time.time():.3f} {os.getpid()} {json.dumps(argv)}\n")
    args, extra = quick_create(argv), []
    if args is None:
        args, extra = parser().parse_known_args(argv)
    if args.command == "pack":
        from pyvmm.oci import image

        return image.main(extra)
    if extra:
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    if args.version:
        print(f"{PROG} version {__version__}\nspec: {OCI_VERSION}")
        return 0
    if args.command is None:
        parser().print_help(sys.stderr)
        return 2
    log = args.logger = Log(args.log, args.log_format)
    args.call_begin, status = begin, 1
    try:
        if getattr(args, "id", None) is not None:
            check_id(args.id)  # before anything names ROOT/ID, runc's state included
        os.makedirs(args.root, mode=DIR_MODE, exist_ok=True)
        if _is_sandbox(args) or _delegated(args):
            delegate(argv, args)
        args.run(args.root, args)
        status = 0
    except (RuntimeError_, BundleError, OSError) as err:
        msg = str(err)
        log.write("error", msg)
        print(f"{PROG}: {msg}", file=sys.stderr)
    finally:
        cid = getattr(args, "id", None)
        if cid and CONTAINER_ID.fullmatch(cid) and len(cid) <= ID_MAX:
            where = os.path.join(args.root, cid)
            timeline.call_end(where, args.command, begin, status, main_ns)
    return status


if __name__ == "__main__":
    sys.exit(main())

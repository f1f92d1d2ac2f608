"""A throw-away network namespace with a tap, for tests, benchmarks and the demo.

Network tests must never touch the host's own namespace: every interface
they create and every frame they send lives in a namespace made here, which
is removed on exit, also on failure and on Ctrl-C.  Namespaces, links and
addresses are managed with pyroute2; processes enter the namespace with
setns(2) between fork and exec.

    from testkit.netns import NetNamespace

    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24", mtu=1400)
        ns.run(["ping", "-c1", "10.0.0.2"])      # runs inside ns
        with ns.inside():                          # this thread, inside ns
            tap = TapBackend.open("tap100")

Inside the namespace /sys/class/net still shows the host's interfaces
(sysfs belongs to the mount namespace, which is left alone): ask netlink or
ioctls, as pyvmm does.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

from pyroute2 import IPRoute, netns
from pyroute2.netlink.rtnl.ndmsg import NUD_PERMANENT

from pyvmm.host.netns import inside, setns

# Processes started inside run from the repository root by default, so
# ``python -m testkit.traffic`` and ``python -m pyvmm`` resolve there.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "pyvmm-test-"
NETNS_DIR = "/var/run/netns"
# How long a started process gets to exit after SIGTERM before SIGKILL.
TERM_GRACE = 2.0


def _host_netns_inos() -> set[int]:
    """Namespaces that must never be cleaned up: ours and init's."""
    inos = set()
    for path in ("/proc/thread-self/ns/net", "/proc/self/ns/net", "/proc/1/ns/net"):
        with contextlib.suppress(OSError):
            inos.add(os.stat(path).st_ino)
    return inos


class NetNamespace:
    """A uniquely named network namespace that exists only inside ``with``.

    The name embeds the creating pid, so a namespace leaked by a killed test
    run is recognised (and removed) by the next one.
    """

    def __init__(self, prefix: str = PREFIX) -> None:
        self.name = f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = os.path.join(NETNS_DIR, self.name)
        self._fd = -1
        self._ino = 0
        self._procs: list[subprocess.Popen[Any]] = []

    # -- lifetime -------------------------------------------------------

    def __enter__(self) -> NetNamespace:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create(self) -> None:
        """Create the namespace and bring its loopback up."""
        if self._fd >= 0:
            raise RuntimeError(f"namespace {self.name} already exists")
        remove_stale_namespaces()
        # pyroute2 unshares in a child process: this process never moves.
        netns.create(self.name)
        atexit.register(self.close)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            self._ino = os.fstat(self._fd).st_ino
            if not self._is_ours():
                raise RuntimeError(f"{self.path} is the host namespace")
            with self.iproute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill what runs inside, delete the links, remove the namespace.

        Idempotent. Every step runs even if an earlier one fails, so the
        namespace is gone whatever state the test left it in.
        """
        errors: list[BaseException] = []
        steps = [self._stop_processes]
        if self.exists():
            if self._is_ours():  # never sweep or strip the host's namespace
                steps += [self._kill_leftovers, self._delete_links]
            steps.append(self._remove)
        for step in steps:
            try:
                step()
            except Exception as err:  # keep cleaning up
                errors.append(err)
        self._close_fd()
        atexit.unregister(self.close)
        if errors:
            raise RuntimeError(f"cleaning up {self.name}: {errors[0]!r}") from errors[0]

    def exists(self) -> bool:
        """Whether the namespace is still mounted under /var/run/netns."""
        return self.name in netns.listnetns()

    # -- configuration ----------------------------------------------------

    def iproute(self) -> IPRoute:
        """An IPRoute bound to this namespace (close it, or use ``with``).

        ``flags=0`` stops pyroute2 from re-creating a namespace that is gone.
        """
        self._require()
        return IPRoute(netns=self.name, flags=0)

    def add_tap(
        self,
        name: str = "tap100",
        address: str | None = "10.0.0.1/24",
        mtu: int | None = None,
        up: bool = True,
        txqlen: int | None = None,
    ) -> int:
        """Create a persistent tap (IFF_NO_PI) in the namespace; its ifindex.

        ``txqlen`` sizes the queue of frames waiting for the tap's reader
        (pyvmm): the kernel drops what does not fit while the reader is off
        the CPU.

        pyroute2 does TUNSETIFF + TUNSETPERSIST in a child that entered the
        namespace, so the tap is born inside it.
        """
        with self.iproute() as ipr:
            ipr.link("add", ifname=name, kind="tuntap", mode="tap", ifr={"no_pi": True})
            index = ipr.link_lookup(ifname=name)[0]
            if mtu is not None:
                ipr.link("set", index=index, mtu=mtu)
            if txqlen is not None:
                ipr.link("set", index=index, txqlen=txqlen)
            if address is not None:
                iface = ipaddress.ip_interface(address)
                ipr.addr(
                    "add",
                    index=index,
                    address=str(iface.ip),
                    prefixlen=iface.network.prefixlen,
                )
            if up:
                ipr.link("set", index=index, state="up")
        return index

    def add_quiet_tap(
        self,
        name: str = "tap100",
        address: str = "10.0.0.1/24",
        txqlen: int | None = None,
        neighbour: tuple[str, str] | None = None,
    ) -> int:
        """A tap on which the only frames are the test's: IPv6 off in the
        namespace (no router or neighbour solicitations), and with
        ``neighbour`` = (IP, MAC) a static entry for the guest (no ARP), so
        exact frame counts hold. Its ifindex."""
        self.sysctl("net.ipv6.conf.all.disable_ipv6", "1")
        self.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        index = self.add_tap(name, address=address, txqlen=txqlen)
        if neighbour is not None:
            self.add_neighbour(name, *neighbour)
        return index

    def add_neighbour(self, ifname: str, ip: str, mac: str) -> None:
        """A permanent neighbour entry: frames to ``ip`` go out on ``ifname``
        at once, with no ARP first."""
        with self.iproute() as ipr:
            index = ipr.link_lookup(ifname=ifname)[0]
            ipr.neigh("replace", dst=ip, lladdr=mac, ifindex=index, state=NUD_PERMANENT)

    def set_mtu(self, ifname: str, mtu: int) -> None:
        """Change an interface's MTU inside the namespace."""
        with self.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], mtu=mtu)

    def link(self, ifname: str) -> dict[str, Any]:
        """Facts about one interface: ``index``, ``mtu``, ``kind``, ``up`` and
        its kernel counters (``stats``: read as pyvmm's --stats reads a tap's)."""
        from pyvmm.devices.net.tap import link_stats

        msg = self._link_message(ifname)
        with self.inside():
            stats = link_stats(msg["index"])
        return {
            "index": msg["index"],
            "mtu": msg.get("mtu"),
            "kind": msg.get(("linkinfo", "kind")),
            "up": bool(msg["flags"] & 1),
            "stats": stats,
        }

    def _link_message(self, ifname: str) -> Any:
        with self.iproute() as ipr:
            links = ipr.get_links(ifname=ifname)
        if not links:
            raise LookupError(f"no interface {ifname!r} in {self.name}")
        return links[0]

    def passes_frames(self, ifname: str) -> bool:
        """Whether frames sent to ``ifname`` now reach its reader: a tap has
        one (its carrier, which the open sets at once) and the kernel has
        acted on it (operstate UP). The kernel does that later, in its link
        watch; until then the device's queue is the no-op one, which drops
        every frame without a count anywhere (on a slow machine, seconds)."""
        msg = self._link_message(ifname)
        return msg.get("carrier") == 1 and msg.get("operstate") == "UP"

    def links(self) -> list[str]:
        """Names of all interfaces in the namespace."""
        with self.iproute() as ipr:
            return [msg.get("ifname") for msg in ipr.get_links()]

    def sysctl(self, key: str, value: str) -> None:
        """Set a ``net.*`` sysctl of this namespace, e.g. ``net.ipv6.conf.all.disable_ipv6``.

        /proc/sys/net resolves against the namespace of the thread that
        opens the file, so the write happens from inside.
        """
        if not key.startswith("net."):
            raise ValueError(f"{key} is not a per-namespace (net.*) sysctl")
        path = "/proc/sys/" + key.replace(".", "/")
        with self.inside(), open(path, "w") as f:
            f.write(value)

    # -- processes --------------------------------------------------------

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace; it is killed on ``close()``.

        The child joins the namespace between fork and exec (preexec_fn), so
        not a single instruction of the program runs in the host namespace.
        Each child leads its own process group so its children die with it.
        """
        self._require()
        ns_fd = self._fd
        user_preexec: Callable[[], Any] | None = kwargs.pop("preexec_fn", None)

        def enter() -> None:
            setns(ns_fd)
            if user_preexec is not None:
                user_preexec()

        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("cwd", ROOT)
        proc = subprocess.Popen(list(argv), preexec_fn=enter, **kwargs)
        self._procs.append(proc)
        return proc

    def start_pyvmm(
        self, *args: str, ready: str = "ready", **kwargs: Any
    ) -> tuple[subprocess.Popen[str], str]:
        """Start ``pyvmm ARGS`` inside the namespace and wait for the guest.

        Returns the process (stdout and stderr piped, text) and the output
        read so far, which ends with the first line starting with ``ready``
        (every network guest prints one once it listens). A tap drops what
        the host sends while no process has it attached, so sending before
        that line would only test that race. Raises RuntimeError with the
        guest's output if it ends first.
        """
        argv = [sys.executable, "-m", "pyvmm", *map(str, args)]
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        head, found = read_until(proc.stdout, ready)
        if found:
            return proc, head
        out, err = proc.communicate(timeout=30)
        raise RuntimeError(f"pyvmm ended before the guest was ready: {head}{out}{err}")

    def run_pyvmm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``pyvmm ARGS`` to its end inside the namespace, output captured
        as text (``start_pyvmm`` is for guests that must be sent traffic)."""
        argv = [sys.executable, "-m", "pyvmm", *map(str, args)]
        return self.run(argv, capture_output=True, text=True, **kwargs)

    def run(
        self,
        argv: Sequence[str],
        *,
        input: Any = None,
        capture_output: bool = False,
        timeout: float | None = 60.0,
        check: bool = False,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` inside the namespace (default timeout 60 s)."""
        if capture_output:
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        if input is not None:
            kwargs["stdin"] = subprocess.PIPE
        proc = self.popen(argv, **kwargs)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            _stop(proc)
            raise
        finally:
            self._procs.remove(proc)
        done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the ``with`` body with the calling thread in the namespace.

        Only this thread moves (setns is per thread); it moves back even if
        the body raises.  Sockets and tap fds opened in the body stay bound
        to the namespace after it ends.
        """
        self._require()
        with inside(self._fd):
            yield

    def pids(self) -> list[int]:
        """Pids of every process whose network namespace is this one."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdecimal():
                continue
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if st.st_ino == self._ino:
                found.append(int(entry))
        return found

    # -- internals --------------------------------------------------------

    def _is_ours(self) -> bool:
        return self._ino != 0 and self._ino not in _host_netns_inos()

    def _require(self) -> None:
        if self._fd < 0:
            raise RuntimeError(f"namespace {self.name} is not open")

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _remove(self) -> None:
        self._close_fd()
        with contextlib.suppress(FileNotFoundError):
            netns.remove(self.name)

    def _stop_processes(self) -> None:
        procs, self._procs = self._procs, []
        for proc in procs:
            _stop(proc)

    def _kill_leftovers(self) -> None:
        """SIGKILL, by pid, anything still inside (grandchildren that escaped
        their process group): nothing but this test's processes can be in a
        namespace it just created."""
        if self._ino == 0:
            return
        deadline = time.monotonic() + TERM_GRACE
        while True:
            pids = [pid for pid in self.pids() if pid != os.getpid()]
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def _delete_links(self) -> None:
        """Delete every link but lo, so no tap outlives the test even briefly
        (namespace teardown in the kernel is asynchronous)."""
        if self._fd < 0:
            return
        with self.iproute() as ipr:
            for msg in ipr.get_links():
                if msg.get("ifname") != "lo":
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=msg["index"])


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL, the process (and its group if it leads one)."""
    if proc.poll() is not None:
        return

    def signal_it(sig: int) -> None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    signal_it(signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        signal_it(signal.SIGKILL)
        proc.wait()


def read_until(stream: Any, prefix: str) -> tuple[str, bool]:
    """A child's output up to and including its first line that starts with
    ``prefix``, and whether that line came (else everything to the end).

    Read from the pipe a byte at a time, so that nothing after that line
    waits in ``stream``'s own buffer: ``communicate()`` with a timeout reads
    the pipe's descriptor, never that buffer, and lines a fast child wrote
    in the same burst (a sender's whole report, say) were lost there."""
    fd = stream.fileno()
    text, line = "", bytearray()
    while chunk := os.read(fd, 1):
        line += chunk
        if chunk == b"\n":
            decoded = line.decode(errors="replace")
            text += decoded
            line.clear()
            if decoded.startswith(prefix):
                return text, True
    return text + line.decode(errors="replace"), False


def remove_stale_namespaces(prefix: str = PREFIX) -> list[str]:
    """Remove namespaces left by test runs whose process no longer exists."""
    removed = []
    for name in netns.listnetns():
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdecimal() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # its creator is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        with contextlib.suppress(OSError):
            netns.remove(name)
            removed.append(name)
    return removed


def can_create_namespaces() -> bool:
    """Whether this process may create namespaces and taps (root, /dev/net/tun)."""
    return os.geteuid() == 0 and os.path.exists("/dev/net/tun")


__all__ = [
    "NetNamespace",
    "can_create_namespaces",
    "remove_stale_namespaces",
]

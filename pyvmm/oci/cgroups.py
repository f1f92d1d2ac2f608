"""The container's cgroup, made and filled as runc's cgroupfs driver does.

A unikernel's VM is one process (pyvmm) with a few threads: the vCPU
thread, the IO thread, helpers. ``create`` makes the cgroup that the
spec's ``linux.cgroupsPath`` names, writes ``linux.resources`` into it and
moves the container's process there before it execs pyvmm, so every
thread pyvmm starts is born inside it and the kernel enforces the limits:
the CFS quota and period, the shares (v2: the weight), the cpuset, the
pids limit and the memory limit. ``delete`` kills whatever is left in it
and removes it.

Both layouts: cgroup v1 (one hierarchy per controller under ROOT, the
ones used here cpu, cpuacct, cpuset, memory and pids) and cgroup v2 (one
hierarchy, ROOT/cgroup.controllers present; the controllers enabled in
each ancestor's cgroup.subtree_control). ROOT is /sys/fs/cgroup unless a
caller (a test's stand-in tree) says otherwise.

The path, as runc reads it:

- ``/a/b``: from the hierarchy's root;
- ``a/b``: below the cgroup of the calling process;
- ``SLICE:PREFIX:NAME`` (with ``--systemd-cgroup``, as containerd's CRI
  passes it with ``SystemdCgroup = true``): the directory systemd would
  make for the scope ``PREFIX-NAME.scope`` in SLICE, the slice's name
  expanded into its parents (``kubepods-besteffort-pod1.slice`` is
  ``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice``).
  pyvmm-oci makes the directories itself and does not ask systemd for a
  transient unit;
- none: ``ID`` below the caller's cgroup.

Memory: the cgroup gets the spec's limit, the guest the limit less
``PYVMM_OVERHEAD_MIB`` for pyvmm itself (docs/orchestration.md says how
it was measured), so the guest filling its memory does not take pyvmm
over the limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time

from pyvmm.common.record import MutableRecord

DEFAULT_ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
V2_CONTROLLERS = ("cpu", "cpuset", "memory", "pids")
#: Memory a VM's cgroup holds besides guest memory: pyvmm's interpreter,
#: its native part, KVM's structures. Measured for a small guest (spin,
#: --mem=8..128): 8.6 MiB charged to its memory cgroup, 14 MiB resident
#: (shared libraries' pages included); 16 leaves room for a network device.
PYVMM_OVERHEAD_MIB = 16
GUEST_MIN_MIB = 2  # pyvmm's smallest --mem
MIB = 1 << 20
#: How long delete waits for the killed processes to leave the cgroup.
EMPTY_TIMEOUT = 5.0
CPU_LIST = re.compile(r"\d{1,6}(-\d{1,6})?(,\d{1,6}(-\d{1,6})?)*")
SYSTEMD_PATH = re.compile(r"[^:/]*:[^:/]*:[^:/]+")


class CgroupError(Exception):
    """A cgroup that cannot be made or a resource that cannot be set (one line)."""


# -- what the spec asks for ----------------------------------------------------


def _int(section: dict, key: str, what: str) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise CgroupError(f"config.json: linux.resources.{what}.{key} is not an integer")
    return value


def _cpu_list(section: dict, key: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not CPU_LIST.fullmatch(value):
        shown = value if isinstance(value, str) and len(value) < 80 else type(value).__name__
        raise CgroupError(
            f"config.json: linux.resources.cpu.{key} {shown!r} is not a list such as 0-3,6"
        )
    return value


def parse_cpu_list(text: str) -> list[int]:
    """``0-2,5`` as [0, 1, 2, 5]."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo or hi - lo > 4096:
            raise CgroupError(f"cpuset {text!r}: {part} is not a range")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def _section(resources: dict, key: str) -> dict:
    value = resources.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CgroupError(f"config.json: linux.resources.{key} is not an object")
    return value


class Resources(MutableRecord):
    """The part of ``linux.resources`` a VM's cgroup gets."""

    __slots__ = ("cpu_quota", "cpu_period", "cpu_shares", "cpus", "mems", "pids", "memory")

    def __init__(
        self,
        cpu_quota: int | None = None,
        cpu_period: int | None = None,
        cpu_shares: int | None = None,
        cpus: str | None = None,
        mems: str | None = None,
        pids: int | None = None,
        memory: int | None = None,
    ) -> None:
        self.cpu_quota = cpu_quota  # microseconds per period; -1: none
        self.cpu_period = cpu_period
        self.cpu_shares = cpu_shares
        self.cpus = cpus
        self.mems = mems
        self.pids = pids  # <= 0: no limit
        self.memory = memory  # bytes; -1: none

    @classmethod
    def from_spec(cls, resources: object) -> Resources:
        if resources is None:
            return cls()
        if not isinstance(resources, dict):
            raise CgroupError("config.json: linux.resources is not an object")
        cpu = _section(resources, "cpu")
        found = cls(
            cpu_quota=_int(cpu, "quota", "cpu"),
            cpu_period=_int(cpu, "period", "cpu"),
            cpu_shares=_int(cpu, "shares", "cpu"),
            cpus=_cpu_list(cpu, "cpus"),
            mems=_cpu_list(cpu, "mems"),
            pids=_int(_section(resources, "pids"), "limit", "pids"),
            memory=_int(_section(resources, "memory"), "limit", "memory"),
        )
        for name in ("cpu_period", "cpu_shares"):
            if (getattr(found, name) or 0) < 0:
                raise CgroupError(f"config.json: linux.resources.cpu.{name[4:]} is negative")
        if found.cpus is not None:
            parse_cpu_list(found.cpus)
        if found.mems is not None:
            parse_cpu_list(found.mems)
        return found

    @property
    def memory_limit(self) -> int | None:
        return self.memory if self.memory is not None and self.memory > 0 else None

    def guest_mem_mib(self) -> int | None:
        """--mem for the guest: the limit less pyvmm's own share."""
        limit = self.memory_limit
        if limit is None:
            return None
        mib = (limit >> 20) - PYVMM_OVERHEAD_MIB
        if mib < GUEST_MIN_MIB:
            raise CgroupError(
                f"memory limit {limit} bytes is too small for a VM: pyvmm needs "
                f"{PYVMM_OVERHEAD_MIB} MiB besides the guest's memory (at least "
                f"{GUEST_MIN_MIB} MiB), so at least {PYVMM_OVERHEAD_MIB + GUEST_MIN_MIB} MiB"
            )
        return mib

    def pin(self) -> tuple[int, int] | None:
        """CPUs for the vCPU and the IO thread inside the cpuset: the first
        two of the set (both on the one CPU of a set of one)."""
        if self.cpus is None:
            return None
        cpus = parse_cpu_list(self.cpus)
        return cpus[0], cpus[1] if len(cpus) > 1 else cpus[0]


# -- where the cgroup is -------------------------------------------------------


def systemd_path(text: str) -> str:
    """``SLICE:PREFIX:NAME`` as the path systemd gives that scope."""
    if not SYSTEMD_PATH.fullmatch(text):
        raise CgroupError(f"cgroupsPath {text!r} is not slice:prefix:name (--systemd-cgroup)")
    slice_, prefix, name = text.split(":")
    slice_ = slice_ or "system.slice"
    if not slice_.endswith(".slice"):
        raise CgroupError(f"cgroupsPath {text!r}: {slice_!r} is not a slice's name")
    parts = []
    if slice_ != "-.slice":
        pieces = slice_[: -len(".slice")].split("-")
        if "" in pieces:
            raise CgroupError(f"cgroupsPath {text!r}: {slice_!r} is not a slice's name")
        parts = ["-".join(pieces[: i + 1]) + ".slice" for i in range(len(pieces))]
    unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope" if prefix else name
    if unit in (".", ".."):
        raise CgroupError(f"cgroupsPath {text!r} names no unit")
    return "/" + "/".join([*parts, unit])


def spec_path(cgroups_path: str | None, cid: str, systemd: bool) -> str:
    """The spec's cgroupsPath as a path: absolute from the hierarchy's root,
    or relative to the caller's cgroup."""
    if cgroups_path is None or cgroups_path == "":
        return cid
    if systemd or (not cgroups_path.startswith("/") and SYSTEMD_PATH.fullmatch(cgroups_path)):
        return systemd_path(cgroups_path)
    if "\0" in cgroups_path:
        raise CgroupError("cgroupsPath contains a NUL character")
    return cgroups_path


def _parts(path: str) -> list[str]:
    """A path's components, ``..`` resolved as if at the root (as runc's
    cleanPath): no path leaves the hierarchy."""
    return [p for p in os.path.normpath("/" + path).split("/") if p]


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller ("" for v2's)."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                found[name] = path
    return found


# -- the file system -----------------------------------------------------------

# What the kernel's cgroupfs does on mkdir and rmdir (a test's stand-in
# tree replaces these to add and remove the interface files).
_mkdir = os.mkdir
_rmdir = os.rmdir


def _write(directory: str, name: str, value: str) -> None:
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as err:
        raise CgroupError(f"cannot open {path}: {err.strerror}") from None
    try:
        os.write(fd, value.encode())
    except OSError as err:
        raise CgroupError(
            f"cannot set {name} to {value!r} in {directory}: {err.strerror}"
        ) from None
    finally:
        os.close(fd)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read().strip()


class Cgroup(MutableRecord):
    """The cgroup made for one container, as state.json keeps it."""

    __slots__ = ("version", "dirs", "made", "path")

    def __init__(
        self, version: int, dirs: dict[str, str], made: list[str] | None = None, path: str = ""
    ) -> None:
        self.version = version
        self.dirs = dirs  # v1: controller -> directory; v2: {"": directory}
        self.made = [] if made is None else made  # directories create made, parents first
        self.path = path  # as the spec named it, for messages

    def to_state(self) -> dict:
        return {"version": self.version, "dirs": self.dirs, "made": self.made, "path": self.path}

    @classmethod
    def from_state(cls, state: dict) -> Cgroup:
        return cls(
            state["version"], dict(state["dirs"]), list(state["made"]), state.get("path", "")
        )

    def leaves(self) -> list[str]:
        return sorted(set(self.dirs.values()))

    def join(self, pid: int) -> None:
        """Move ``pid`` (all its threads) into every hierarchy's leaf."""
        for leaf in self.leaves():
            _write(leaf, "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for leaf in self.leaves():
            with contextlib.suppress(OSError):
                found.update(int(x) for x in _read(leaf, "cgroup.procs").split())
        return sorted(found)

    def signal_all(self, signum: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def remove(self, timeout: float = EMPTY_TIMEOUT) -> None:
        """Kill what is left inside, then remove the leaves and the parents
        create made that nothing else uses now."""
        deadline = time.monotonic() + timeout
        for leaf in self.leaves():
            while True:
                try:
                    _rmdir(leaf)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(
                            f"cannot remove the cgroup {leaf}: {err.strerror}"
                        ) from None
                    self.signal_all(signal.SIGKILL)
                    time.sleep(0.01)
        leaves = set(self.leaves())
        for directory in reversed(self.made):
            if directory not in leaves:
                with contextlib.suppress(OSError):  # another container's, or gone
                    _rmdir(directory)


# -- making it -----------------------------------------------------------------


def _make_dirs(base: str, parts: list[str], made: list[str], before=None, fill=None) -> str:
    """``base/parts...``, each level made if missing (``before(parent)``
    first, ``fill(parent, level)`` after); a parent another container's
    delete removes meanwhile is made again."""
    for _attempt in range(5):
        directory = base
        try:
            for part in parts:
                parent, directory = directory, os.path.join(directory, part)
                if before is not None:
                    before(parent)
                try:
                    _mkdir(directory, 0o755)
                    made.append(directory)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    raise
                except OSError as err:
                    raise CgroupError(
                        f"cannot make the cgroup {directory}: {err.strerror}"
                    ) from None
                if fill is not None:
                    fill(parent, directory)
            return directory
        except FileNotFoundError:
            continue
    raise CgroupError(f"cannot make the cgroup {os.path.join(base, *parts)}: its parent went away")


def _inherit_cpuset(parent: str, directory: str) -> None:
    """A v1 cpuset starts empty, and an empty one takes no process: a new
    level gets its parent's CPUs and memory nodes."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not _read(directory, name):
            _write(directory, name, _read(parent, name))


def _v1_hierarchies(root: str) -> dict[str, str]:
    return {
        c: os.path.join(root, c) for c in V1_CONTROLLERS if os.path.isdir(os.path.join(root, c))
    }


def _needed(resources: Resources) -> set[str]:
    need = set()
    if any(
        v is not None for v in (resources.cpu_quota, resources.cpu_period, resources.cpu_shares)
    ):
        need.add("cpu")
    if resources.cpus is not None or resources.mems is not None:
        need.add("cpuset")
    if resources.pids is not None:
        need.add("pids")
    if resources.memory is not None:
        need.add("memory")
    return need


def is_v2(root: str = DEFAULT_ROOT) -> bool:
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def create(path: str, resources: Resources, root: str = DEFAULT_ROOT) -> Cgroup:
    """Make the cgroup and write the resources into it (no process yet).
    On failure nothing create made is left."""
    cgroup = Cgroup(2 if is_v2(root) else 1, {}, [], path)
    try:
        if cgroup.version == 2:
            _create_v2(cgroup, path, resources, root)
        else:
            _create_v1(cgroup, path, resources, root)
    except BaseException:
        with contextlib.suppress(CgroupError):
            cgroup.remove(timeout=0)
        raise
    return cgroup


def _base(path: str, own: str) -> list[str]:
    return _parts(path) if path.startswith("/") else _parts(own + "/" + path)


def _create_v1(cgroup: Cgroup, path: str, resources: Resources, root: str) -> None:
    hierarchies = _v1_hierarchies(root)
    missing = sorted(_needed(resources) - set(hierarchies))
    if missing:
        raise CgroupError(
            f"the container's resources need the cgroup controller {', '.join(missing)}, "
            f"which is not mounted under {root}"
        )
    own = _own_cgroups() if not path.startswith("/") else {}
    for name, base in sorted(hierarchies.items()):
        fill = _inherit_cpuset if name == "cpuset" else None
        parts = _base(path, own.get(name, "/"))
        if not parts:
            raise CgroupError(f"cgroupsPath {path!r} is the root cgroup")
        cgroup.dirs[name] = _make_dirs(base, parts, cgroup.made, fill=fill)
    d = cgroup.dirs
    r = resources
    if r.cpu_shares:
        _write(d["cpu"], "cpu.shares", str(r.cpu_shares))
    if r.cpu_period:
        _write(d["cpu"], "cpu.cfs_period_us", str(r.cpu_period))
    if r.cpu_quota is not None and r.cpu_quota != 0:
        _write(d["cpu"], "cpu.cfs_quota_us", str(r.cpu_quota if r.cpu_quota > 0 else -1))
    if r.cpus is not None:
        _write(d["cpuset"], "cpuset.cpus", r.cpus)
    if r.mems is not None:
        _write(d["cpuset"], "cpuset.mems", r.mems)
    if r.pids is not None and r.pids != 0:
        _write(d["pids"], "pids.max", str(r.pids) if r.pids > 0 else "max")
    if r.memory is not None and r.memory != 0:
        _write(d["memory"], "memory.limit_in_bytes", str(r.memory if r.memory > 0 else -1))


def shares_to_weight(shares: int) -> int:
    """cgroup v1's cpu.shares (2..262144) as v2's cpu.weight (1..10000), runc's mapping."""
    shares = min(max(shares, 2), 262144)
    return 1 + ((shares - 2) * 9999) // 262142


def _create_v2(cgroup: Cgroup, path: str, resources: Resources, root: str) -> None:
    available = set(_read(root, "cgroup.controllers").split())
    missing = sorted(_needed(resources) - available)
    if missing:
        raise CgroupError(
            f"the container's resources need the cgroup controller {', '.join(missing)}, "
            f"which {root}/cgroup.controllers does not offer"
        )
    own = _own_cgroups().get("", "/") if not path.startswith("/") else "/"
    parts = _base(path, own)
    if not parts:
        raise CgroupError(f"cgroupsPath {path!r} is the root cgroup")

    def enable(parent: str) -> None:
        # A controller reaches a cgroup only through its parent's subtree_control.
        offered = set(_read(parent, "cgroup.controllers").split())
        enabled = set(_read(parent, "cgroup.subtree_control").split())
        for name in V2_CONTROLLERS:
            if name in offered and name not in enabled:
                _write(parent, "cgroup.subtree_control", "+" + name)

    leaf = _make_dirs(root, parts, cgroup.made, before=enable)
    cgroup.dirs[""] = leaf
    r = resources
    if r.cpu_quota is not None or r.cpu_period:
        quota = str(r.cpu_quota) if r.cpu_quota and r.cpu_quota > 0 else "max"
        _write(leaf, "cpu.max", f"{quota} {r.cpu_period or 100000}")
    if r.cpu_shares:
        _write(leaf, "cpu.weight", str(shares_to_weight(r.cpu_shares)))
    if r.cpus is not None:
        _write(leaf, "cpuset.cpus", r.cpus)
    if r.mems is not None:
        _write(leaf, "cpuset.mems", r.mems)
    if r.pids is not None and r.pids != 0:
        _write(leaf, "pids.max", str(r.pids) if r.pids > 0 else "max")
    if r.memory is not None and r.memory != 0:
        _write(leaf, "memory.max", str(r.memory) if r.memory > 0 else "max")

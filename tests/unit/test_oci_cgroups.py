"""pyvmm-oci's cgroups without a container: what the spec asks for, the
paths runc's two drivers name, and a cgroup v2 hierarchy made and removed
in a stand-in tree (this host's cgroups are v1; tests/test_oci.py runs the
v1 path on the real one under containerd)."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from pyvmm.oci import cgroups
from pyvmm.oci.cgroups import (
    PYVMM_OVERHEAD_MIB,
    CgroupError,
    Resources,
    parse_cpu_list,
    shares_to_weight,
    spec_path,
    systemd_path,
)

# -- the spec ------------------------------------------------------------------


def test_resources_are_read_from_linux_resources():
    found = Resources.from_spec(
        {
            "cpu": {"quota": 25000, "period": 100000, "shares": 512, "cpus": "0-2,5", "mems": "0"},
            "pids": {"limit": 64},
            "memory": {"limit": 64 << 20, "swap": 64 << 20},
            "devices": [{"allow": False, "access": "rwm"}],  # a Linux process's business
        }
    )
    assert found == Resources(25000, 100000, 512, "0-2,5", "0", 64, 64 << 20)
    assert found.guest_mem_mib() == 64 - PYVMM_OVERHEAD_MIB
    assert found.pin() == (0, 1)
    assert Resources.from_spec(None) == Resources()
    assert Resources().guest_mem_mib() is None and Resources().pin() is None


@pytest.mark.parametrize(
    ("cpus", "pin"), [("3", (3, 3)), ("1-3", (1, 2)), ("7,2", (2, 7)), ("0,0-1", (0, 1))]
)
def test_the_vcpu_and_io_threads_get_the_first_two_cpus_of_the_set(cpus, pin):
    assert Resources(cpus=cpus).pin() == pin


def test_a_cpu_list_is_read_as_the_kernel_does():
    assert parse_cpu_list("0-2,5,9-10") == [0, 1, 2, 5, 9, 10]
    with pytest.raises(CgroupError, match="is not a range"):
        parse_cpu_list("3-1")


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ([], "linux.resources is not an object"),
        ({"cpu": 1}, "linux.resources.cpu is not an object"),
        ({"cpu": {"quota": "1"}}, "linux.resources.cpu.quota is not an integer"),
        ({"cpu": {"shares": True}}, "linux.resources.cpu.shares is not an integer"),
        ({"cpu": {"period": -5}}, "linux.resources.cpu.period is negative"),
        ({"cpu": {"cpus": "0-a"}}, "linux.resources.cpu.cpus '0-a' is not a list such as 0-3,6"),
        ({"cpu": {"mems": 0}}, "linux.resources.cpu.mems 'int' is not a list"),
        ({"cpu": {"cpus": "1\n+memory"}}, "is not a list such as"),  # no second line to write
        ({"cpu": {"cpus": "1" * 5000}}, "is not a list such as"),  # (int() refuses 4300 digits)
        ({"pids": {"limit": 1.5}}, "linux.resources.pids.limit is not an integer"),
        ({"memory": {"limit": "1G"}}, "linux.resources.memory.limit is not an integer"),
    ],
)
def test_a_bad_resource_gets_one_line(resources, message):
    with pytest.raises(CgroupError, match=message.replace("(", r"\(")) as err:
        Resources.from_spec(resources)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mib", [0, 1, PYVMM_OVERHEAD_MIB, PYVMM_OVERHEAD_MIB + 1])
def test_a_memory_limit_too_small_for_pyvmm_and_a_guest_is_refused(mib):
    limit = max(mib << 20, 4096)
    with pytest.raises(CgroupError) as err:
        Resources(memory=limit).guest_mem_mib()
    assert str(err.value) == (
        f"memory limit {limit} bytes is too small for a VM: pyvmm needs {PYVMM_OVERHEAD_MIB} "
        f"MiB besides the guest's memory (at least 2 MiB), so at least "
        f"{PYVMM_OVERHEAD_MIB + 2} MiB"
    )
    assert Resources(memory=(PYVMM_OVERHEAD_MIB + 2) << 20).guest_mem_mib() == 2
    assert Resources(memory=-1).guest_mem_mib() is None  # no limit


def test_shares_become_a_weight_as_runc_maps_them():
    assert [shares_to_weight(s) for s in (2, 1024, 262144, 1, 10**9)] == [1, 39, 10000, 1, 10000]


# -- paths ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "kubepods-besteffort-pod1.slice:cri-containerd:abc",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
            "cri-containerd-abc.scope",
        ),
        (":cri-containerd:abc", "/system.slice/cri-containerd-abc.scope"),
        ("-.slice:p:n", "/p-n.scope"),
        ("machine.slice::n.slice", "/machine.slice/n.slice"),
    ],
)
def test_systemd_s_form_names_the_directory_systemd_gives_the_scope(text, path):
    assert systemd_path(text) == path
    assert spec_path(text, "id", systemd=True) == path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/default/x", "is not slice:prefix:name"),
        ("a:b", "is not slice:prefix:name"),
        ("pods:p:n", "'pods' is not a slice's name"),
        ("a--b.slice:p:n", "'a--b.slice' is not a slice's name"),
        ("-.slice::..", "names no unit"),
    ],
)
def test_a_bad_systemd_path_gets_one_line(text, message):
    with pytest.raises(CgroupError, match=message):
        spec_path(text, "id", systemd=True)


def test_the_cgroupfs_driver_s_paths():
    assert spec_path("/default/c1", "c1", systemd=False) == "/default/c1"
    assert spec_path("pods/c1", "c1", systemd=False) == "pods/c1"  # below the caller's
    assert spec_path(None, "c1", systemd=False) == "c1"  # runc's default: the id
    # What containerd's CRI passes with SystemdCgroup, without --systemd-cgroup
    assert spec_path("k.slice:cri:c1", "c1", systemd=False) == "/k.slice/cri-c1.scope"


# -- cgroup v2, in a stand-in tree ---------------------------------------------

V2_FILES = {  # controller: the interface files the kernel adds to a new cgroup
    "cpu": ("cpu.max", "cpu.weight", "cpu.stat"),
    "cpuset": ("cpuset.cpus", "cpuset.mems"),
    "memory": ("memory.max", "memory.current"),
    "pids": ("pids.max", "pids.current"),
}
ROOT_CPUS = "0-1"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Cgroup2Tree:
    """What the kernel does in a cgroup2 mount, for the calls pyvmm-oci
    makes: a new directory gets cgroup.* files and the files of the
    controllers its parent's subtree_control enables; subtree_control
    takes +NAME for a controller the cgroup offers; cgroup.procs takes
    pids; rmdir refuses a cgroup a live process is in; cpuset.cpus must
    be inside the root's CPUs."""

    def __init__(self, root, offered="cpuset cpu io memory pids") -> None:
        self.root = str(root)
        (root / "cgroup.controllers").write_text(offered + "\n")
        (root / "cgroup.subtree_control").write_text("")
        (root / "cgroup.procs").write_text("")
        self.real_write = cgroups._write

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)
        with open(os.path.join(os.path.dirname(path), "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        for name in ("cgroup.procs", "cgroup.subtree_control"):
            open(os.path.join(path, name), "w").close()
        with open(os.path.join(path, "cgroup.controllers"), "w") as f:
            f.write(" ".join(enabled))
        for controller in enabled:
            for name in V2_FILES.get(controller, ()):
                open(os.path.join(path, name), "w").close()

    def rmdir(self, path: str) -> None:
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]:
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        with open(os.path.join(path, "cgroup.procs")) as f:
            if any(_alive(int(pid)) for pid in f.read().split()):
                raise OSError(errno.EBUSY, "Device or resource busy", path)
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)

    def write(self, directory: str, name: str, value: str) -> None:
        path = os.path.join(directory, name)
        if name == "cgroup.subtree_control" and os.path.exists(path):
            with open(os.path.join(directory, "cgroup.controllers")) as f:
                offered = f.read().split()
            with open(path) as f:
                enabled = f.read().split()
            if value[0] != "+" or value[1:] not in offered:
                raise CgroupError(f"cannot set {name} to {value!r} in {directory}: Invalid")
            value = " ".join(sorted({*enabled, value[1:]}))
        elif name == "cgroup.procs" and os.path.exists(path):
            with open(path) as f:
                value = f.read() + value + "\n"
        elif name == "cpuset.cpus" and not set(parse_cpu_list(value)) <= {0, 1}:
            raise CgroupError(f"cannot set {name} to {value!r} in {directory}: Invalid argument")
        self.real_write(directory, name, value)

    def read(self, *parts: str) -> str:
        with open(os.path.join(self.root, *parts)) as f:
            return f.read().strip()


@pytest.fixture
def tree(tmp_path, monkeypatch):
    fake = Cgroup2Tree(tmp_path / "cg")
    monkeypatch.setattr(cgroups, "_mkdir", fake.mkdir)
    monkeypatch.setattr(cgroups, "_rmdir", fake.rmdir)
    monkeypatch.setattr(cgroups, "_write", fake.write)
    return fake


@pytest.fixture
def cgroup_root(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    return root


def test_v2_limits_go_into_the_cgroup_with_its_controllers_enabled_above(cgroup_root, tree):
    resources = Resources(
        cpu_quota=25000, cpu_period=50000, cpu_shares=512, cpus="1", mems="0", pids=32
    )
    resources.memory = 64 << 20
    assert cgroups.is_v2(tree.root)
    cg = cgroups.create("/kubepods/pod1/c1", resources, root=tree.root)
    leaf = os.path.join(tree.root, "kubepods", "pod1", "c1")
    assert (cg.version, cg.dirs) == (2, {"": leaf})
    for level in ((), ("kubepods",), ("kubepods", "pod1")):
        assert tree.read(*level, "cgroup.subtree_control") == "cpu cpuset memory pids"
    assert tree.read("kubepods/pod1/c1/cgroup.subtree_control") == ""  # the leaf holds processes
    files = ("cpu.max", "cpu.weight", "cpuset.cpus", "cpuset.mems", "pids.max", "memory.max")
    assert [tree.read("kubepods/pod1/c1", f) for f in files] == [
        "25000 50000",
        str(shares_to_weight(512)),
        "1",
        "0",
        "32",
        str(64 << 20),
    ]
    assert cg.made == [os.path.join(tree.root, p) for p in ("kubepods", "kubepods/pod1", leaf)]
    # state.json keeps it; delete reads it back
    assert cgroups.Cgroup.from_state(cg.to_state()) == cg


def test_v2_unlimited_values_are_written_as_max(cgroup_root, tree):
    cgroups.create("/c2", Resources(cpu_quota=-1, pids=-1, memory=-1), root=tree.root)
    assert [tree.read("c2", f) for f in ("cpu.max", "pids.max", "memory.max")] == [
        "max 100000",
        "max",
        "max",
    ]


def test_v2_delete_kills_what_is_left_and_removes_what_create_made(cgroup_root, tree):
    tree.mkdir(os.path.join(tree.root, "kubepods"))  # someone else's: it stays
    tree.mkdir(os.path.join(tree.root, "kubepods", "other"))
    cg = cgroups.create("/kubepods/pod1/c1", Resources(), root=tree.root)
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        cg.join(leftover.pid)
        assert cg.pids() == [leftover.pid]
        cg.remove()
        assert leftover.wait(timeout=10) == -9
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
    kubepods = os.path.join(tree.root, "kubepods")
    assert [d for d in os.listdir(kubepods) if os.path.isdir(os.path.join(kubepods, d))] == [
        "other"
    ]
    cg.remove()  # again: nothing to do


def test_v2_a_controller_the_hierarchy_does_not_offer_is_one_line(tmp_path, monkeypatch):
    fake = Cgroup2Tree(tmp_path, offered="cpu memory")
    monkeypatch.setattr(cgroups, "_mkdir", fake.mkdir)
    with pytest.raises(CgroupError) as err:
        cgroups.create("/c1", Resources(pids=10, cpus="0"), root=fake.root)
    assert str(err.value) == (
        "the container's resources need the cgroup controller cpuset, pids, "
        f"which {fake.root}/cgroup.controllers does not offer"
    )
    assert not os.path.exists(os.path.join(fake.root, "c1"))


def test_v2_a_refused_value_leaves_nothing_made(cgroup_root, tree):
    with pytest.raises(CgroupError, match=r"cannot set cpuset.cpus to '5' in .*c1: Invalid"):
        cgroups.create("/a/b/c1", Resources(cpus="5", pids=3), root=tree.root)
    assert sorted(os.listdir(tree.root)) == [
        "cgroup.controllers",
        "cgroup.procs",
        "cgroup.subtree_control",
    ]


@pytest.mark.parametrize("path", ["/../../escape/c1", "../../../escape/c1"])
def test_a_path_never_leaves_the_hierarchy(cgroup_root, tree, path, monkeypatch):
    monkeypatch.setattr(cgroups, "_own_cgroups", lambda: {"": "/here"})
    cg = cgroups.create(path, Resources(), root=tree.root)
    assert os.path.commonpath([cg.dirs[""], tree.root]) == tree.root
    cg.remove()
    assert not os.path.exists(os.path.join(os.path.dirname(tree.root), "escape"))


def test_a_relative_path_is_below_the_caller_s_cgroup(cgroup_root, tree, monkeypatch):
    monkeypatch.setattr(cgroups, "_own_cgroups", lambda: {"": "/user/session"})
    cg = cgroups.create("c1", Resources(), root=tree.root)
    assert cg.dirs[""] == os.path.join(tree.root, "user", "session", "c1")


def test_a_directory_that_cannot_be_made_is_one_line(cgroup_root, tree):
    with pytest.raises(CgroupError, match="cannot make the cgroup .*: File name too long"):
        cgroups.create("/a/" + "x" * 300, Resources(), root=tree.root)
    assert not os.path.exists(os.path.join(tree.root, "a"))


def test_the_root_cgroup_is_refused(cgroup_root, tree):
    with pytest.raises(CgroupError, match="is the root cgroup"):
        cgroups.create("/", Resources(), root=tree.root)


# -- the native front end's summary ----------------------------------------------


def _state(dirs: dict[str, str]) -> dict:
    return {
        "id": "c1",
        "pid": 42,
        "start_time": "1234",
        "bundle": "/b",
        "rootfs": "/b/rootfs",
        "created": "2026-01-01T00:00:00+00:00",
        "annotations": {"a": "x\ny"},
        "link": None,
        "cgroup": {"version": 1, "dirs": dirs, "made": sorted(set(dirs.values())), "path": "/p"},
    }


def test_create_s_summary_for_the_native_front_end(tmp_path):
    from pyvmm.oci.runtime import Container

    container = Container(str(tmp_path), "c1")
    os.mkdir(container.dir)
    container.save_native(_state({"cpu": "/cg/cpu/p", "pids": "/cg/pids/p"}))
    lines = (tmp_path / "c1" / "native").read_text().splitlines()
    assert lines[:7] == [
        "pyvmm-oci-native 1",
        "pid 42 1234",
        "net 0",
        "leaf /cg/cpu/p",
        "leaf /cg/pids/p",
        "made /cg/cpu/p",
        "made /cg/pids/p",
    ]
    assert lines[7].startswith("state {") and len(lines) == 8  # the annotation's newline escaped
    assert json.loads(lines[7][6:])["annotations"] == {"a": "x\ny"}
    assert oct(os.stat(tmp_path / "c1" / "native").st_mode & 0o777) == "0o600"


def test_a_cgroup_path_with_a_newline_leaves_every_call_to_python(tmp_path):
    from pyvmm.oci.runtime import Container

    container = Container(str(tmp_path), "c1")
    os.mkdir(container.dir)
    container.save_native(_state({"cpu": "/cg/cpu/a\nleaf /etc"}))
    assert not (tmp_path / "c1" / "native").exists()

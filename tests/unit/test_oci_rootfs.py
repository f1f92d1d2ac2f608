"""Paths an image names are resolved inside its rootfs (pyvmm.oci.rootfs),
by openat2 and by the descriptor walk used where the kernel lacks it: links
and ``..`` never leave the rootfs, only regular files open, and a name that
points at the host reads the same as a missing one."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import stat
import subprocess
import sys

import pytest

from pyvmm.oci import rootfs
from pyvmm.oci.rootfs import Missing, NotInRootfs

SECRET = b"host secret\n"


@pytest.fixture(params=["openat2", "walk"])
def how(request, monkeypatch):
    """Each test once with the kernel's resolution, once with the walk."""
    monkeypatch.setattr(rootfs, "use_openat2", request.param == "openat2")
    return request.param


@pytest.fixture
def tree(tmp_path):
    """A rootfs beside a host file it must never reach."""
    host = tmp_path / "host-secret"
    host.write_bytes(SECRET)
    host.chmod(0o600)
    root = tmp_path / "rootfs"
    (root / "unikernel").mkdir(parents=True)
    (root / "unikernel" / "kernel.hvt").write_bytes(b"the kernel")
    (root / "disk.img").write_bytes(b"the disk")
    links = {
        "abs-in": "/unikernel/kernel.hvt",  # absolute: from the rootfs
        "dir": "/unikernel",
        "up-in": "../../../../unikernel/kernel.hvt",  # .. stops at the rootfs
        "to-host": str(host),  # exists on the host
        "to-nowhere": str(tmp_path / "no-such-file"),  # does not
        "up-host": "../" * 12 + str(host).lstrip("/"),
        "loop-a": "loop-b",
        "loop-b": "loop-a",
        "magic": "/proc/self/root" + str(host),
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    os.mkfifo(root / "fifo")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    yield root, fd, host
    os.close(fd)


def content(fd: int) -> bytes:
    try:
        return os.pread(fd, 100, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/unikernel/kernel.hvt", b"the kernel"),
        ("unikernel/kernel.hvt", b"the kernel"),
        ("/abs-in", b"the kernel"),
        ("/dir/kernel.hvt", b"the kernel"),
        ("/up-in", b"the kernel"),
        ("/../../unikernel/./kernel.hvt", b"the kernel"),
        ("/dir/../disk.img", b"the disk"),
    ],
)
def test_links_and_dotdot_resolve_inside_the_rootfs(tree, how, path, expected):
    _, root_fd, _ = tree
    assert content(rootfs.open_file(root_fd, path)) == expected


@pytest.mark.parametrize(
    "path", ["/to-host", "/to-nowhere", "/up-host", "/loop-a", "/magic", "/nope", "/dir/x/y"]
)
def test_what_points_out_of_the_rootfs_reads_as_missing(tree, how, path):
    """One message whether the host has the file or not: nothing about the
    host can be learnt from an image's links."""
    _, root_fd, host = tree
    with pytest.raises(Missing) as info:
        rootfs.open_file(root_fd, path, write=True)
    assert str(info.value) == "is not a file in the rootfs"
    assert host.read_bytes() == SECRET


def test_a_fifo_is_refused_without_being_opened(tree, how):
    """Opening a FIFO for reading would block until a writer came."""
    _, root_fd, _ = tree
    with pytest.raises(NotInRootfs, match="^is not a regular file$"):
        rootfs.open_file(root_fd, "/fifo")


@pytest.mark.parametrize(
    ("kind", "device"),
    [(stat.S_IFCHR, os.makedev(1, 3)), (stat.S_IFBLK, os.makedev(7, 0))],
    ids=["char", "block"],
)
def test_device_nodes_from_an_image_are_refused(tree, how, kind, device):
    root, root_fd, _ = tree
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(root / "node", kind | 0o600, device)
    os.symlink("/node", root / "to-node")
    for path in ("/node", "/to-node"):
        with pytest.raises(NotInRootfs, match="is a device node"):
            rootfs.open_file(root_fd, path, write=True)


def test_a_directory_is_refused(tree, how):
    _, root_fd, _ = tree
    for path in ("/", "/dir", "/unikernel/", "/.."):
        with pytest.raises(NotInRootfs, match="^is a directory$"):
            rootfs.open_file(root_fd, path)


def test_the_descriptor_is_the_file_that_was_checked(tree, how):
    """Swapping the name for a link to the host afterwards changes nothing:
    pyvmm is handed the descriptor, never the name."""
    root, root_fd, host = tree
    fd = rootfs.open_file(root_fd, "/disk.img", write=True)
    try:
        assert fd >= 3
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.unlink(root / "disk.img")
        os.symlink(host, root / "disk.img")
        os.pwrite(fd, b"written", 0)
    finally:
        os.close(fd)
    assert host.read_bytes() == SECRET


def test_read_file_caps_the_size_and_tells_missing_apart(tree, how):
    root, root_fd, _ = tree
    assert rootfs.read_file(root_fd, "/disk.img", 100) == b"the disk"
    assert rootfs.read_file(root_fd, "/to-host", 100) is None
    with pytest.raises(NotInRootfs, match="larger than 4 bytes"):
        rootfs.read_file(root_fd, "/disk.img", 4)


def test_without_openat2_the_walk_takes_over(tree, monkeypatch):
    """A kernel older than 5.6 answers ENOSYS: the walk, from then on."""
    _, root_fd, _ = tree

    def enosys(root_fd: int, path: str) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(rootfs, "use_openat2", True)
    monkeypatch.setattr(rootfs, "_openat2", enosys)
    assert content(rootfs.open_file(root_fd, "/abs-in")) == b"the kernel"
    assert rootfs.use_openat2 is False
    with pytest.raises(Missing):
        rootfs.open_file(root_fd, "/to-host")


def test_the_walk_leaks_no_descriptor(tree, monkeypatch):
    _, root_fd, _ = tree
    monkeypatch.setattr(rootfs, "use_openat2", False)
    before = sorted(os.listdir("/proc/self/fd"))
    for path in ("/dir/kernel.hvt", "/up-host", "/loop-a", "/dir/../dir/../fifo", "/dir"):
        try:
            os.close(rootfs.open_file(root_fd, path))
        except NotInRootfs:
            pass
    assert sorted(os.listdir("/proc/self/fd")) == before


# A rootfs with the host's /proc bind-mounted into it (in a mount namespace
# of its own): a link through /proc/self/root must still not reach the host.
MAGIC = r"""
import ctypes, json, os, sys
from pyvmm.oci import rootfs
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x20000) == 0  # CLONE_NEWNS
assert libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) == 0  # MS_REC | MS_PRIVATE
root, host = sys.argv[1], sys.argv[2]
assert libc.mount(b"/proc", os.path.join(root, "proc").encode(), None, 4096, None) == 0  # MS_BIND
fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
seen = {}
for how in ("openat2", "walk"):
    rootfs.use_openat2 = how == "openat2"
    for path in ("/proc/self/root" + host, "/proc/1/root" + host, "/magic", "/proc/self/cwd"):
        try:
            got = os.pread(rootfs.open_file(fd, path), 100, 0).decode()
        except rootfs.NotInRootfs as err:
            got = str(err)
        seen[how + " " + path] = got
print(json.dumps(seen))
"""


def test_links_through_proc_are_not_followed_out_of_the_rootfs(tree):
    root, _, host = tree
    if os.geteuid() != 0:
        pytest.skip("a mount namespace needs root")
    (root / "proc").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", MAGIC, str(root), str(host)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen) == 8
    assert all(SECRET.decode() not in got for got in seen.values()), seen
    assert all(got.startswith("is ") for got in seen.values()), seen


def test_openat2_is_what_this_kernel_uses():
    """The walk is the fallback, not what runs here (Linux >= 5.6)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        os.close(rootfs._openat2(fd, "etc"))
    finally:
        os.close(fd)
    assert ctypes.sizeof(rootfs._OpenHow) == 24

"""The sandbox's filter as the build compiled it: read only when it is
exactly what compiling the same rules now gives, from a file only the
extension's owner may have written; anything else is compiled again."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys

import pytest

from pyvmm import _native
from pyvmm.host import sandbox, sandbox_prebuilt


@pytest.fixture
def written(tmp_path):
    files = sandbox.write_prebuilt(str(tmp_path))
    assert sorted(os.path.basename(f) for f in files) == [
        "_sandbox-errno.bpf",
        "_sandbox-kill.bpf",
    ]
    for name in files:  # readable by all, written by its owner only, never executable
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o644
    return tmp_path


@pytest.mark.parametrize("kill", [False, True])
def test_the_written_program_is_the_one_compiled_now(written, kill):
    loaded = sandbox_prebuilt.load(sandbox.ALLOW, kill, str(written))
    assert loaded == sandbox.compile_program(kill=kill)
    assert loaded != sandbox.compile_program(kill=not kill)


def test_the_build_wrote_the_programs_beside_the_extension():
    """setup.py's build_ext step (also `pip install -e`, scripts/setup)."""
    for kill in (False, True):
        assert sandbox_prebuilt.load(sandbox.ALLOW, kill) == sandbox.compile_program(kill=kill)


def test_a_process_takes_the_program_it_finds(written, monkeypatch):
    """program() reads the file: a process never compiles what it finds."""
    monkeypatch.setattr(sandbox, "_programs", {})
    monkeypatch.setattr(
        sandbox_prebuilt, "path", lambda kill, directory=None: str(written / "_sandbox-errno.bpf")
    )

    def refuse(**_: object) -> bytes:
        raise AssertionError("compiled although a program was there")

    monkeypatch.setattr(sandbox, "compile_program", refuse)
    assert sandbox.program() == (written / "_sandbox-errno.bpf").read_bytes().split(b"\n", 1)[1]


def test_other_rules_ignore_the_file(written):
    fewer = tuple(n for n in sandbox.ALLOW if n != "getcpu")
    assert sandbox_prebuilt.load(fewer, False, str(written)) is None
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is not None


def test_a_rebuilt_extension_makes_the_file_stale(written, monkeypatch, tmp_path):
    copy = tmp_path / "copy.so"
    copy.write_bytes(open(_native.__file__, "rb").read())
    monkeypatch.setattr(_native, "__file__", str(copy))
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_a_file_others_may_write_is_ignored(written, mode):
    target = written / "_sandbox-errno.bpf"
    os.chmod(target, mode)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None
    os.chmod(target, 0o644)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is not None


def test_a_file_of_another_owner_is_ignored(written):
    target = written / "_sandbox-errno.bpf"
    os.chown(target, os.stat(_native.__file__).st_uid + 1, -1)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None


def test_a_link_is_not_followed(written):
    target = written / "_sandbox-errno.bpf"
    real = written / "real.bpf"
    os.rename(target, real)
    os.symlink(real, target)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],  # not whole instructions
        lambda data: data.split(b"\n", 1)[0] + b"\n",  # no program
        lambda data: b"pyvmm-seccomp/2" + data[len(b"pyvmm-seccomp/1") :],
        lambda data: data.replace(b" ", b"  ", 1),
        lambda data: b"",
        lambda data: data + b"\0" * (8 * _native.lib.PYVMM_SANDBOX_PROG_MAX),  # too long
    ],
)
def test_a_damaged_file_is_ignored(written, damage):
    target = written / "_sandbox-errno.bpf"
    target.write_bytes(damage(target.read_bytes()))
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None


def test_no_file_is_no_program(tmp_path):
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(tmp_path)) is None


def test_a_program_of_the_most_bytes_the_load_takes_is_read(written):
    """The size check's edge: PYVMM_SANDBOX_PROG_MAX bytes are taken (the
    kernel judges the program itself when it is loaded)."""
    target = written / "_sandbox-errno.bpf"
    header = target.read_bytes().split(b"\n", 1)[0] + b"\n"
    largest = b"\0" * _native.lib.PYVMM_SANDBOX_PROG_MAX
    target.write_bytes(header + largest)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) == largest
    target.write_bytes(header + largest + b"\0" * 8)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is None


def test_the_file_is_read_through_a_descriptor_no_child_inherits(written, monkeypatch):
    seen = []
    fstat = os.fstat

    def checking(fd):
        seen.append(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        return fstat(fd)

    monkeypatch.setattr(sandbox_prebuilt.os, "fstat", checking)
    assert sandbox_prebuilt.load(sandbox.ALLOW, False, str(written)) is not None
    assert seen == [fcntl.FD_CLOEXEC]


def test_the_build_step_says_what_it_wrote():
    """``python -m pyvmm.host.sandbox`` (setup.py's step) writes
    both programs beside the extension and names them."""
    done = subprocess.run(
        [sys.executable, "-m", "pyvmm.host.sandbox"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [sandbox_prebuilt.path(False), sandbox_prebuilt.path(True)]
    for kill in (False, True):
        assert sandbox_prebuilt.load(sandbox.ALLOW, kill) == sandbox.compile_program(kill=kill)


class _Refusing:
    """pyvmm._native.lib with pyvmm_sandbox_build failing with ``err``."""

    def __init__(self, err: int) -> None:
        self.err = err

    def pyvmm_sandbox_build(self, *args: object) -> int:
        return self.err

    def __getattr__(self, name: str) -> object:
        return getattr(_native.lib, name)


@pytest.mark.parametrize("err", [-1, -12])  # EPERM (a container's seccomp profile), ENOMEM
def test_a_compile_that_fails_is_one_line(monkeypatch, err):
    from pyvmm.common.errors import HostError

    monkeypatch.setattr(sandbox, "lib", _Refusing(err))
    with pytest.raises(HostError) as raised:
        sandbox.compile_program(False)
    assert str(raised.value).endswith(f"{os.strerror(-err)} (--no-sandbox runs without)")

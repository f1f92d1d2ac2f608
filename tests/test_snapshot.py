"""Snapshots: taken at the guest's first wait, restored in a new process.

guests/resume.c folds a heap buffer before its first wait and again after
it, and checks its clocks across the wait: a run that is snapshotted at
the wait and restored prints, across the two processes, exactly what an
uninterrupted run prints. Every damaged or foreign snapshot is refused in
one line with status 1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess

import pytest

from conftest import GUESTS, ROOT, popen_pyvmm, run_pyvmm
from pyvmm.vm.snapshot import format as snapshot_format

pytestmark = pytest.mark.kvm

MEM = "--mem=8"
ARGS = ("4096",)


@pytest.fixture(scope="module")
def resume():
    """guests/resume.c, built (its rule is make's pattern rule)."""
    subprocess.run(["make", "-C", str(ROOT / "guests"), "-s", "bin/resume.hvt"], check=True)
    return GUESTS / "resume.hvt"


def one_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def take(kernel, directory, *options: str, stop: bool = True) -> subprocess.CompletedProcess:
    result = run_pyvmm(
        MEM,
        *options,
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        *(["--snapshot-stop"] if stop else []),
        kernel,
        *ARGS,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def snapshot(resume, tmp_path_factory):
    """One snapshot of resume.hvt, and what it printed before it (not to be
    changed: tests that damage one copy it first)."""
    directory = tmp_path_factory.mktemp("snap") / "s"
    result = take(resume, directory)
    return directory, result.stdout


def copy_of(snapshot, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(snapshot[0], directory)
    os.chmod(directory, 0o700)
    return directory


@pytest.mark.parametrize("cpl", ["3", "deprivileged", "0"])
def test_a_restored_run_continues_as_an_uninterrupted_one(resume, tmp_path, cpl):
    whole = run_pyvmm(MEM, f"--cpl={cpl}", resume, *ARGS)
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.endswith("SUCCESS\n")
    before = take(resume, tmp_path / "s", f"--cpl={cpl}")
    assert before.stdout.startswith("before: ") and "after" not in before.stdout
    after = run_pyvmm("--restore", tmp_path / "s")
    assert after.returncode == 0, after.stderr
    assert before.stdout + after.stdout == whole.stdout
    # A snapshot restores any number of times, each the same.
    again = run_pyvmm(f"--restore={tmp_path / 's'}")
    assert again.stdout == after.stdout


def test_the_guest_runs_on_after_its_snapshot(resume, tmp_path):
    whole = run_pyvmm(MEM, resume, *ARGS)
    going_on = take(resume, tmp_path / "s", stop=False)
    assert going_on.stdout == whole.stdout
    restored = run_pyvmm(f"--restore={tmp_path / 's'}")
    assert restored.returncode == 0, restored.stderr
    first, rest = whole.stdout.split("\n", 1)
    assert first.startswith("before: ") and restored.stdout == rest


def test_the_directory_is_owner_only_and_the_memory_sparse(snapshot):
    directory, _ = snapshot
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for name in ("snapshot.json", "cpu.state", "memory"):
        assert stat.S_IMODE(os.stat(directory / name).st_mode) == 0o600, name
    memory = directory / "memory"
    info = os.stat(memory)
    assert info.st_size == 8 << 20
    pages = json.loads((directory / "snapshot.json").read_text())["memory"]["pages"]
    assert 0 < pages < 256
    # Only the pages written take space; the rest are holes.
    assert info.st_blocks * 512 <= pages * 4096 + 65536
    with open(memory, "rb") as f:
        first_hole = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
        assert first_hole < info.st_size
        data = os.lseek(f.fileno(), first_hole, os.SEEK_DATA)
        assert data > first_hole


def test_an_existing_directory_is_never_written_over(resume, tmp_path):
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / "keep").write_text("mine")
    result = run_pyvmm(
        MEM, "--snapshot-at=first-wait", f"--snapshot-dir={directory}", resume, *ARGS
    )
    assert "exists" in one_line(result)
    assert os.listdir(directory) == ["keep"]


def test_a_run_that_never_waits_leaves_no_directory(tmp_path):
    directory = tmp_path / "s"
    result = run_pyvmm(
        MEM, "--snapshot-at=first-wait", f"--snapshot-dir={directory}", GUESTS / "hello.hvt"
    )
    assert result.returncode == 0, result.stderr
    assert not directory.exists()


def test_a_run_stopped_before_it_waits_leaves_no_directory(tmp_path):
    directory = tmp_path / "s"
    proc = popen_pyvmm(
        MEM, "--snapshot-at=first-wait", f"--snapshot-dir={directory}", GUESTS / "spin.hvt"
    )
    try:
        assert proc.stdout.readline() == "spinning\n"  # running, its directory made
        assert directory.is_dir()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert not directory.exists()


def test_a_sigusr2_snapshot_during_a_wait_restores_to_the_same_end(resume, tmp_path):
    """SIGUSR2 stops the vCPU between two exits, in the C fast path's wait:
    the restored guest waits out the rest and ends as a run never stopped."""
    whole = run_pyvmm(MEM, resume, "4096", "1")
    assert whole.returncode == 0, whole.stderr
    directory = tmp_path / "s"
    proc = popen_pyvmm(
        MEM,
        "--snapshot-at=sigusr2",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        resume,
        "4096",
        "5000",
    )
    try:
        first = proc.stdout.readline()  # its wait of 5 s has begun
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert first + out == whole.stdout.split("\n", 1)[0] + "\n"
    assert err == f"pyvmm: snapshot written to {directory}; the run ends there (--snapshot-stop)\n"
    restored = run_pyvmm(f"--restore={directory}")
    assert restored.returncode == 0, restored.stderr
    assert first + restored.stdout == whole.stdout.replace("args: 4096 1", "args: 4096 5000")


def test_sigusr2_is_not_both_gdbs_kick_and_the_trigger(resume, tmp_path):
    line = one_line(
        run_pyvmm(
            MEM,
            "--gdb-socket",
            tmp_path / "gdb.sock",
            "--snapshot-at=sigusr2",
            f"--snapshot-dir={tmp_path / 's'}",
            resume,
        )
    )
    assert "not with --gdb" in line
    assert not (tmp_path / "s").exists()


def reseal(directory, change) -> None:
    """Change the metadata and give it a valid checksum again: a snapshot
    made by someone else, not a damaged one."""
    path = directory / "snapshot.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_bytes(snapshot_format.seal(document))


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(document):
        target = document
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


def _another_kernels_identity(document):
    """Another unikernel's hash, and a file identity that is not this one's
    (the recorded file is then not the one restored, so the hash decides)."""
    document["kernel"]["sha256"] = "0" * 64
    document["kernel"]["file"]["ino"] += 1


@pytest.mark.parametrize(
    "change, expected",
    [
        (_set("version", 2), "format version 2"),
        (_set("format", "other"), "not a pyvmm snapshot"),
        (_set("arch", "aarch64"), "taken on an aarch64 host"),
        (_set("plan", "mem_size", 3 << 20), "not a 2 MiB multiple"),
        (_set("plan", "mem_size", "8M"), "plan.mem_size"),
        (_set("plan", "mode", "ring-1"), "unknown privilege mode"),
        (_set("plan", "usable", 1 << 40), "plan.usable"),
        (_set("plan", "guest_args", ["1"]), "command line"),
        (_another_kernels_identity, "is not the unikernel"),
        (_set("kernel", "file", {"dev": 1, "ino": -1}), "kernel.file.ino"),
        (_set("kernel", "file", "/dev/null"), "kernel.file"),
        (_set("devices", [{"name": "n", "type": "sound", "handle": 0}]), "unknown type 'sound'"),
        (_set("devices", [{"name": "n", "type": "net", "handle": 0}]), "it needs: n"),
        (_set("device_state", {"sound": {}}), "a device kind this pyvmm does not have"),
        (_set("device_state", {"net": {}}), "net state"),
        (_set("plan", "options", {"shm": "fast"}), "'fast' is not one of"),
        (_set("plan", "options", {"net": "tap0"}), "unknown option '--net'"),
        (_set("clock", "tsc_khz", 1), "TSC runs at 1 kHz"),
        (_set("clock", "tsc", -1), "clock.tsc"),
        (_set("cpu_state", "sha256", "0" * 64), "cpu.state fails its checksum"),
        (_set("memory", "size", 4 << 20), "size"),
        (_set("shadow", {"gdt_base": "x"}), "trap emulator"),
        (lambda d: d.pop("clock"), "snapshot.clock"),
    ],
)
def test_a_foreign_or_inconsistent_snapshot_is_refused(snapshot, tmp_path, change, expected):
    directory = copy_of(snapshot, tmp_path)
    reseal(directory, change)
    assert expected in one_line(run_pyvmm(f"--restore={directory}"))


def test_corrupted_metadata_fails_its_checksum(snapshot, tmp_path):
    directory = copy_of(snapshot, tmp_path)
    path = directory / "snapshot.json"
    path.write_text(path.read_text().replace('"mem_size": 8388608', '"mem_size": 4194304'))
    assert "fails its checksum" in one_line(run_pyvmm(f"--restore={directory}"))
    path.write_bytes(b"\x00garbage")
    assert "not JSON" in one_line(run_pyvmm(f"--restore={directory}"))
    path.write_bytes(b"[" * 100000)  # deeper than the parser goes
    assert "not JSON" in one_line(run_pyvmm(f"--restore={directory}"))
    path.write_bytes(b"[]")
    assert "not a pyvmm snapshot" in one_line(run_pyvmm(f"--restore={directory}"))


@pytest.mark.parametrize("name", ["snapshot.json", "cpu.state", "memory"])
def test_a_truncated_file_is_refused(snapshot, tmp_path, name):
    directory = copy_of(snapshot, tmp_path)
    path = directory / name
    os.truncate(path, os.stat(path).st_size // 2)
    line = one_line(run_pyvmm(f"--restore={directory}"))
    assert any(word in line for word in ("checksum", "truncated", "not JSON")), line


def test_a_missing_file_is_an_incomplete_snapshot(snapshot, tmp_path):
    directory = copy_of(snapshot, tmp_path)
    os.unlink(directory / "snapshot.json")
    assert "incomplete" in one_line(run_pyvmm(f"--restore={directory}"))
    assert "cannot open" in one_line(run_pyvmm(f"--restore={tmp_path / 'none'}"))


def test_a_snapshot_others_can_read_is_refused(snapshot, tmp_path):
    directory = copy_of(snapshot, tmp_path)
    os.chmod(directory, 0o755)
    assert "owner-only" in one_line(run_pyvmm(f"--restore={directory}"))


def test_a_changed_kernel_file_is_refused(resume, tmp_path):
    kernel = tmp_path / "resume.hvt"
    shutil.copy(resume, kernel)
    take(kernel, tmp_path / "s")
    image = kernel.read_bytes()
    assert image.count(b"before: 0x") == 1
    kernel.write_bytes(image.replace(b"before: 0x", b"BEFORE: 0x"))
    line = one_line(run_pyvmm(f"--restore={tmp_path / 's'}"))
    assert "is not the unikernel" in line
    kernel.write_bytes(image)  # the same bytes again: restored
    assert run_pyvmm(f"--restore={tmp_path / 's'}").returncode == 0


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--restore=D", "k.hvt"), "come from the snapshot"),
        (("--restore=D", "--mem=64"), "keeps the snapshot's"),
        (("--snapshot-at=first-wait", "k.hvt"), "missing --snapshot-dir"),
        (("--snapshot-dir=D", "k.hvt"), "only with --snapshot-at"),
        (("--snapshot-stop", "k.hvt"), "only with --snapshot-at"),
        (("--snapshot-at=later", "--snapshot-dir=D", "k.hvt"), "not one of first-wait"),
    ],
)
def test_snapshot_options_are_checked(args, expected):
    assert expected in one_line(run_pyvmm(*args))


@pytest.fixture(scope="module")
def resumeblk():
    subprocess.run(["make", "-C", str(ROOT / "guests"), "-s", "bin/resumeblk.hvt"], check=True)
    return GUESTS / "resumeblk.hvt"


def test_a_disk_attached_anew_continues_as_in_an_uninterrupted_run(resumeblk, tmp_path):
    whole_disk, disk = tmp_path / "whole.img", tmp_path / "disk.img"
    for path in (whole_disk, disk):
        path.write_bytes(bytes(1 << 20))
    whole = run_pyvmm(MEM, f"--block:storage={whole_disk}", resumeblk)
    assert whole.returncode == 0, whole.stderr
    before = run_pyvmm(
        MEM,
        f"--block:storage={disk}",
        "--snapshot-at=first-wait",
        f"--snapshot-dir={tmp_path / 's'}",
        "--snapshot-stop",
        resumeblk,
    )
    assert before.returncode == 0, before.stderr
    after = run_pyvmm(f"--restore={tmp_path / 's'}", f"--block:storage={disk}")
    assert after.returncode == 0, after.stderr
    assert before.stdout + after.stdout == whole.stdout
    assert disk.read_bytes() == whole_disk.read_bytes()


def test_a_disk_of_another_geometry_or_none_is_refused(resumeblk, tmp_path):
    disk = tmp_path / "disk.img"
    disk.write_bytes(bytes(1 << 20))
    directory = tmp_path / "s"
    result = run_pyvmm(
        MEM,
        f"--block:storage={disk}",
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        resumeblk,
    )
    assert result.returncode == 0, result.stderr
    other = tmp_path / "other.img"
    other.write_bytes(bytes(2 << 20))
    line = one_line(run_pyvmm(f"--restore={directory}", f"--block:storage={other}"))
    assert "the snapshot's was 1048576" in line
    line = one_line(
        run_pyvmm(
            f"--restore={directory}", "--block-sector-size:storage=4096", f"--block:storage={disk}"
        )
    )
    assert "blocks of 4096" in line
    assert "--block:storage=" in one_line(run_pyvmm(f"--restore={directory}"))


def test_a_copy_of_the_kernel_elsewhere_is_the_same_unikernel(resume, tmp_path):
    """Another file (its own inode and times) with the same bytes: the
    recorded file identity does not match, the hash of what is loaded does."""
    kernel = tmp_path / "resume.hvt"
    shutil.copy(resume, kernel)
    take(kernel, tmp_path / "s")
    document = json.loads((tmp_path / "s" / "snapshot.json").read_text())
    st = os.stat(kernel)
    assert document["kernel"]["file"] == {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }
    kernel.rename(tmp_path / "moved.hvt")
    shutil.copy(tmp_path / "moved.hvt", kernel)
    assert os.stat(kernel).st_ino != st.st_ino
    assert run_pyvmm(f"--restore={tmp_path / 's'}").returncode == 0
    image = kernel.read_bytes()  # another file, other bytes: refused
    kernel.write_bytes(image.replace(b"before: 0x", b"BEFORE: 0x"))
    assert "not the unikernel" in one_line(run_pyvmm(f"--restore={tmp_path / 's'}"))


def _restate(directory, change) -> None:
    """cpu.state's parts changed, its checksum and size in the metadata made
    to match: a snapshot someone else wrote, not a damaged one."""
    from pyvmm.vm.snapshot import vcpu

    path = directory / "cpu.state"
    parts = snapshot_format.unpack_state(path.read_bytes(), vcpu.state_sizes())
    change(parts)
    packed = snapshot_format.pack_state(parts)
    path.write_bytes(packed)
    digest = snapshot_format.checksum(packed)
    reseal(directory, _set("cpu_state", "sha256", digest))
    reseal(directory, _set("cpu_state", "size", len(packed)))


x86_only = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64's CPUID")


def _entries(raw: bytes) -> list[bytes]:
    return [raw[i : i + 40] for i in range(0, len(raw), 40)]


@x86_only
def test_the_snapshot_keeps_the_cpuid_its_guest_was_shown(snapshot):
    """A boot shows the guest KVM's supported CPUID; the snapshot keeps
    the vCPU's entries as KVM then had them (their values as KVM updated
    them from the guest's state: OSXSAVE, the APIC id), a leaf at most once
    and only leaves the host offered (KVM may keep fewer than it offered:
    an Intel host of this kind kept 56 of 59, without leaves 0x1d, 0x1e
    and 0x24), the ones every guest reads among them, and a restore
    sets them again (no host query)."""
    from pyvmm._native import ffi
    from pyvmm.arch.x86_64 import cpu
    from pyvmm.kvm import System
    from pyvmm.vm.snapshot import vcpu

    raw = (snapshot[0] / "cpu.state").read_bytes()
    saved = snapshot_format.unpack_state(raw, vcpu.state_sizes())["cpuid"]
    with System() as system:
        supported = cpu.supported_cpuid(system)
        host = bytes(ffi.buffer(supported.entries, supported.nent * 40))
    leaves = [entry[:8] for entry in _entries(saved)]  # (function, index)
    offered = {entry[:8] for entry in _entries(host)}
    assert len(set(leaves)) == len(leaves) and set(leaves) <= offered
    functions = {int.from_bytes(leaf[:4], "little") for leaf in leaves}
    assert {0, 1, 7, 0xD, 0x80000000, 0x80000001, 0x80000008} <= functions


@x86_only
def test_a_snapshot_without_a_cpuid_takes_the_hosts(resume, snapshot, tmp_path):
    directory = copy_of(snapshot, tmp_path)
    _restate(directory, lambda parts: parts.pop("cpuid"))
    restored = run_pyvmm(f"--restore={directory}")
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.endswith("SUCCESS\n")


def _bad_address_width(parts) -> None:
    """Leaf 0x80000008 saying 32-bit virtual addresses: KVM accepts 48 or 57."""
    entries = _entries(parts["cpuid"])
    for i, entry in enumerate(entries):
        if int.from_bytes(entry[:4], "little") == 0x80000008:
            eax = int.from_bytes(entry[12:16], "little")
            eax = (eax & ~0xFF00) | (32 << 8)
            entries[i] = entry[:12] + eax.to_bytes(4, "little") + entry[16:]
            break
    else:
        pytest.skip("this KVM shows no leaf 0x80000008")
    parts["cpuid"] = b"".join(entries)


@x86_only
@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda parts: parts.update(cpuid=parts["cpuid"][:-1]), "part 'cpuid' is"),
        (lambda parts: parts.update(cpuid=parts["cpuid"] * 5), "part 'cpuid' is"),
        (_bad_address_width, "this KVM refuses its vCPU set-up: KVM_SET_CPUID2"),
    ],
)
def test_a_cpuid_the_format_or_kvm_refuses_is_one_line(snapshot, tmp_path, change, expected):
    directory = copy_of(snapshot, tmp_path)
    _restate(directory, change)
    assert expected in one_line(run_pyvmm(f"--restore={directory}"))

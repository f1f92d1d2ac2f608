"""An OCI bundle's process.user: the VM's host process runs on as those ids
once its devices are open (pyvmm --user=UID:GID), and bad ids are refused
in one line at create, before anything is made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import guest
from pyvmm.common.errors import HostError
from pyvmm.host.sandbox import resolve_user
from pyvmm.oci.bundle import BundleError, read_bundle
from pyvmm.oci.runtime import pyvmm_argv, pyvmm_command

NOBODY = 65534


def make_bundle(tmp_path, user=None):
    rootfs = tmp_path / "rootfs"
    (rootfs / "unikernel").mkdir(parents=True)
    shutil.copy(guest("hello"), rootfs / "unikernel" / "kernel.hvt")
    process: dict = {"args": ["/unikernel/kernel.hvt"]}
    if user is not None:
        process["user"] = user
    spec = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": process}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return str(tmp_path)


def vm_argv(bundle: str) -> list[str]:
    kernel = read_bundle(bundle)
    try:
        return pyvmm_argv(kernel, None, None)[len(pyvmm_command()) :]
    finally:
        kernel.close()


@pytest.mark.parametrize("user", [None, {}, {"uid": 0, "gid": 0}, {"uid": 0}])
def test_root_or_no_user_keeps_pyvmms_own(tmp_path, user):
    assert not any(a.startswith("--user") for a in vm_argv(make_bundle(tmp_path, user)))


@pytest.mark.parametrize(
    "user, flag",
    [
        ({"uid": 1000, "gid": 100}, "--user=1000:100"),
        ({"uid": 1000}, "--user=1000:0"),
        ({"gid": 5, "additionalGids": [7]}, "--user=0:5"),
        ({"uid": 4294967294, "gid": 4294967294}, "--user=4294967294:4294967294"),
    ],
)
def test_a_user_becomes_the_vms_ids(tmp_path, user, flag):
    argv = vm_argv(make_bundle(tmp_path, user))
    assert flag in argv and argv.index(flag) < argv.index("--")


@pytest.mark.parametrize(
    "user",
    [
        {"uid": -1},
        {"uid": 4294967295},
        {"gid": "0"},
        {"uid": True},
        {"uid": 1.0},
        {"uid": 2**70},
        "root",
        [0, 0],
    ],
)
def test_a_bad_user_is_one_line(tmp_path, user):
    with pytest.raises(BundleError) as err:
        read_bundle(make_bundle(tmp_path, user))
    assert "process.user" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text, ids",
    [("0:0", (0, 0, None)), ("1000:100", (1000, 100, None)), ("nobody", (NOBODY, None, "nobody"))],
)
def test_user_names_and_numbers(text, ids):
    uid, gid, name = resolve_user(text)
    assert (uid, name) == (ids[0], ids[2])
    if ids[1] is not None:
        assert gid == ids[1]


@pytest.mark.parametrize(
    "text", ["a:1", "1:", ":1", "1:2:3", "٣:0", "4294967295:0", "-1:0", " 1:0"]
)
def test_bad_user_numbers_are_refused(text):
    with pytest.raises(HostError) as err:
        resolve_user(text)
    assert str(err.value).startswith(f"--user={text}:") or "no user named" in str(err.value)


@pytest.mark.kvm
def test_the_vm_runs_as_the_numeric_user(tmp_path):
    """The host process (every thread) ends as UID:GID with no
    supplementary group, and the guest runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", f"--user={NOBODY}:{NOBODY}", guest("spin")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            tasks = os.listdir(f"/proc/{proc.pid}/task")
            states = [open(f"/proc/{proc.pid}/task/{t}/status").read() for t in tasks]
            uids = [line for s in states for line in s.splitlines() if line.startswith("Uid:")]
            if len(tasks) > 1 and all(u.split()[1:] == [str(NOBODY)] * 4 for u in uids):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.05)
        for status in states:
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            assert fields["Gid"].split() == [str(NOBODY)] * 4
            assert fields["Groups"].split() == []
    finally:
        proc.kill()
        proc.communicate()

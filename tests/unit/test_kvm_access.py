"""The advice for a /dev/kvm this user may not open follows the device
node's owner, group and mode: joining a group helps only where that group
may open it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pyvmm.kvm import access

KVM_GID = 104
NAMES = {0: "root", KVM_GID: "kvm"}


def node(mode: int, gid: int, uid: int = 0) -> os.stat_result:
    """A character device's stat result, as os.stat gives it."""
    return os.stat_result((stat.S_IFCHR | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


def advise(st: os.stat_result, groups=(1000,), members=()) -> str:
    return access.advice(
        "/dev/kvm",
        st=st,
        groups=list(groups),
        user="alice",
        group_name=lambda gid: NAMES.get(gid, str(gid)),
        members=lambda gid: list(members),
    )


def test_a_kvm_group_with_0660_says_join_it():
    assert advise(node(0o660, KVM_GID)) == (
        "/dev/kvm is root:kvm, mode 0660: join group kvm (usermod -aG kvm alice, then log "
        "in again) or run as root"
    )


def test_root_root_0600_says_run_as_root_or_set_up_a_kvm_group():
    text = advise(node(0o600, 0))
    assert text.startswith("/dev/kvm is root:root, mode 0600: only root may open it: run as root")
    assert "groupadd -r kvm" in text and access.UDEV_RULE in text
    assert "join group root" not in text


def test_root_root_0660_does_not_send_anyone_into_roots_group():
    text = advise(node(0o660, 0))
    assert "only root and group root may open it: run as root" in text
    assert "join group root" not in text


def test_a_kvm_group_without_group_rights_is_no_group_to_join():
    assert "only root may open it" in advise(node(0o600, KVM_GID))


def test_a_member_listed_but_not_in_this_session_logs_in_again():
    assert advise(node(0o660, KVM_GID), members=["alice"]) == (
        "/dev/kvm is root:kvm, mode 0660: alice was added to group kvm after this session "
        "started: log in again (or run newgrp kvm)"
    )


def test_in_the_group_and_still_refused_names_what_else_decides():
    text = advise(node(0o660, KVM_GID), groups=[1000, KVM_GID])
    assert "alice is in group kvm, yet the open was refused" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes nobody: needs root")
def test_system_gives_the_advice_when_the_open_is_refused():
    """The real refusal: a root-only node opened as nobody (in a directory
    nobody can search, unlike pytest's tmp_path)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as where:
        os.chmod(where, 0o755)
        path = Path(where) / "kvm"
        path.write_bytes(b"")
        path.chmod(0o600)
        _refused_as_nobody(path)


def _refused_as_nobody(path: Path) -> None:
    code = (
        "import os, sys, grp, pwd\n"
        "from pyvmm.kvm import System\n"
        "import pyvmm.kvm.access\n"
        "from pyvmm.common.errors import HostError\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    System({str(path)!r})\n"
        "except HostError as err:\n"
        "    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"Could not open: {path}: no permission: {path} is root:root, mode 0600: only root "
        "may open it: run as root, or give it a kvm group (groupadd -r kvm; a udev rule "
        f"{access.UDEV_RULE} in /etc/udev/rules.d/; udevadm trigger) and join that group\n"
    )

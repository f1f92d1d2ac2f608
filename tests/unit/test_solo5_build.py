"""scripts/solo5_build.py without building Solo5: its refusals, the archive
check, the lock, and the command that installs pyvmm's bindings into a
Solo5 toolchain (tests/test_solo5_bindings.py runs the real build)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT
from scripts import solo5_build


def test_missing_archive_is_one_line_and_status_2(tmp_path):
    script = ROOT / "scripts" / "solo5_build.py"
    done = subprocess.run(
        [sys.executable, str(script), "--archive", str(tmp_path / "none.tar.gz")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    missing = tmp_path / "none.tar.gz"
    assert done.stderr == (
        f"solo5-build: no Solo5 release archive at {missing} (set PYVMM_SOLO5_ARCHIVE)\n"
    )


def test_archive_members_outside_are_refused(tmp_path):
    bad = tmp_path / "solo5-bad.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(payload, arcname="solo5-bad/ok")
        tar.add(payload, arcname="solo5-bad/../../escaped")
    with pytest.raises(solo5_build.BuildError, match="is not a plain file"):
        solo5_build.extract(bad, tmp_path / "into")
    assert not (tmp_path / "escaped").exists()


def test_a_second_caller_waits_for_the_lock(tmp_path):
    """Two builds at once: the second waits until the first lets go."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from scripts import solo5_build as b\n"
            f"with b.locked(b.Path({str(tmp_path)!r}), print):\n"
            "    print('locked', flush=True); time.sleep(1.5)\n"
            "    print('letting go', flush=True)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        said: list[str] = []
        with solo5_build.locked(tmp_path, said.append):
            # Printed while the holder still held the lock: already there.
            ready, _, _ = select.select([holder.stdout], [], [], 0)
            assert ready and holder.stdout.readline() == "letting go\n"
        assert said == [f"waiting for another build in {tmp_path}"]
    finally:
        holder.wait(timeout=10)


def test_install_command_puts_the_bindings_in_a_toolchain(tmp_path):
    triple = solo5_build.target_triple()
    (tmp_path / "lib" / triple).mkdir(parents=True)
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "guests"), "install-solo5", f"SOLO5_PREFIX={tmp_path}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for name in ("solo5_pyvmm.o", "solo5_pyvmm.lds"):
        installed = tmp_path / "lib" / triple / name
        assert installed.read_bytes() == (ROOT / "guests" / "bin" / name).read_bytes()
    header = tmp_path / "include" / "solo5" / "solo5_net_batch.h"
    assert "solo5_net_queue" in header.read_text()


def test_install_command_refuses_a_directory_without_a_toolchain(tmp_path):
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "guests"), "install-solo5", f"SOLO5_PREFIX={tmp_path}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, MAKEFLAGS=""),
    )
    assert done.returncode != 0
    triple = solo5_build.target_triple()
    assert f"install-solo5: {tmp_path}/lib/{triple}: no Solo5 toolchain there" in done.stderr

"""What an install gives a user: a regular ``pip install`` into a fresh
virtual environment (not the editable one scripts/setup makes) puts the
native launcher on PATH as ``pyvmm``, not a Python wrapper, and that
command finds the installed package (not this checkout) and boots a guest.
Also the set-up's own promises: ``man pyvmm`` and the commands on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, guest

ELF_MAGIC = b"\x7fELF"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A copy of the tracked sources, pip-installed into a new venv."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            dst = source / os.fsdecode(name)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    venv = base / "venv"
    python = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python3"), "-m", "pip", "install", "-q", str(source)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(source)
    return venv


def test_pip_install_puts_the_native_launcher_on_path(installed):
    command = installed / "bin" / "pyvmm"
    assert command.read_bytes()[:4] == ELF_MAGIC, "pip's Python wrapper, not the launcher"
    assert os.access(command, os.X_OK)


@pytest.mark.kvm
def test_the_installed_command_runs_the_installed_package(installed, tmp_path):
    # From a directory where this checkout is nowhere on the path, with no
    # venv activated: the launcher picks the interpreter beside it.
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    probe = subprocess.run(
        [str(installed / "bin" / "python3"), "-c", "import pyvmm; print(pyvmm.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=env,
    )
    assert probe.stdout.startswith(str(installed)), probe.stdout
    result = subprocess.run(
        [str(installed / "bin" / "pyvmm"), "--mem=8", str(guest("hello"))],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "Hello, world" in result.stdout


def test_the_set_up_installs_the_manual_page_and_the_commands():
    if shutil.which("man") is None:
        pytest.fail("man is not on PATH: scripts/setup installs man-db")
    page = subprocess.run(["man", "-w", "pyvmm"], capture_output=True, text=True)
    assert page.returncode == 0, page.stderr
    assert Path(page.stdout.strip()).read_text().startswith(".TH PYVMM"), page.stdout
    for command in ("pyvmm", "pyvmm-oci"):
        found = shutil.which(command, path="/usr/local/bin")
        assert found is not None, f"{command} is not in /usr/local/bin"

"""pyvmm-oci's command line without a container: container ids, --help,
--version, the image packer as a command, what it writes and its modes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib

import pytest

from conftest import guest
from pyvmm import __version__
from pyvmm.oci.runtime import Log, append_private, check_id, main, write_private

BAD_IDS = [".runc", ".", "..", "", "a/b", "../x", "a b", "x\n", "é", "x" * 256, ".x", "a\0b"]


@pytest.mark.parametrize("command", ["delete", "delete --force", "state", "kill", "start", "ps"])
def test_delete_of_runc_s_directory_is_refused_and_touches_nothing(tmp_path, capsys, command):
    """ROOT/.runc holds the state of the pod sandboxes handed to runc: no
    container id may name it (or anything else starting with a dot)."""
    sandbox = tmp_path / ".runc" / "pause1"
    sandbox.mkdir(parents=True)
    (sandbox / "state.json").write_text("{}")
    assert main(["--root", str(tmp_path), *command.split(), ".runc"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyvmm-oci: invalid container id '.runc': ") and err.count("\n") == 1
    assert (sandbox / "state.json").read_text() == "{}"


@pytest.mark.parametrize("cid", BAD_IDS, ids=repr)
def test_ids_runc_would_refuse_are_refused(cid):
    with pytest.raises(Exception, match="invalid container id") as info:
        check_id(cid)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("cid", ["abc", "a.b", "x_1+2,3-4", "0" * 64, "k8s_pod.1"])
def test_ids_runc_takes_are_taken(tmp_path, capsys, cid):
    assert check_id(cid) == cid
    assert main(["--root", str(tmp_path), "state", cid]) == 1
    assert capsys.readouterr().err == f"pyvmm-oci: container {cid} does not exist\n"


def test_help_lists_the_supported_commands_one_line_each():
    done = subprocess.run(
        [sys.executable, "-m", "pyvmm.oci", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    listed = {}
    for line in lines:
        words = line.split(maxsplit=1)
        if line.startswith("    ") and len(words) == 2:
            listed[words[0]] = words[1]
    assert list(listed) == ["create", "start", "state", "kill", "delete", "ps", "features", "pack"]
    assert all(len(line) <= 80 for line in lines), lines
    for verb in ("exec", "pause", "checkpoint"):  # named as unsupported, not as commands
        assert verb not in listed


def test_an_unknown_or_unsupported_command_gets_one_line(capsys):
    assert main(["exec", "c1", "sh"]) == 1
    assert capsys.readouterr().err == (
        "pyvmm-oci: exec is not supported by pyvmm-oci (a unikernel is one process)\n"
    )
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'frobnicate'" in err and "exec" not in err


def test_the_version_is_pyvmm_s(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"pyvmm-oci version {__version__}\nspec: 1.0.2\n"


def test_pyproject_takes_the_version_from_the_package():
    """One version: the package's, which both commands print."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pyvmm.__version__"}


def test_pack_is_the_image_packer(tmp_path, capsys):
    out = tmp_path / "hello.tar"
    assert main(["pack", "-o", str(out), str(guest("hello")), "--name", "x/hello:1", "a"]) == 0
    assert capsys.readouterr().out == "x/hello:1\n"
    assert out.stat().st_size > 0
    assert main(["pack", "-o", str(tmp_path / "y.tar"), sys.executable]) == 1
    assert capsys.readouterr().err.startswith(f"pyvmm-oci pack: {sys.executable}: ")


def test_written_files_are_root_s_only_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "state.json"
        write_private(str(path), "{}")
        Log(str(tmp_path / "log"), "json").write("error", "x")
    finally:
        os.umask(old)
    for name in ("state.json", "log"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    assert json.loads((tmp_path / "log").read_text())["msg"] == "x"
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked")  # never followed
    with pytest.raises(OSError):
        append_private(str(tmp_path / "linked"), "x\n")
    assert not (tmp_path / "elsewhere").exists()


def test_the_documented_binary_name_is_where_the_set_up_links_the_command():
    """docs/orchestration.md's BinaryName and --runc-binary are the path
    scripts/setup puts pyvmm-oci at (the native front end pyvmm/_oci,
    linked into PYVMM_BIN_DIR, by default /usr/local/bin)."""
    top = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(top, "scripts", "setup")) as f:
        setup = f.read()
    assert "bin_dir=${PYVMM_BIN_DIR:-/usr/local/bin}" in setup
    assert 'ln -sfn "$PWD/pyvmm/_oci" "$bin_dir/pyvmm-oci"' in setup
    with open(os.path.join(top, "docs", "orchestration.md")) as f:
        docs = f.read()
    assert 'BinaryName = "/usr/local/bin/pyvmm-oci"' in docs
    assert docs.count("--runc-binary /usr/local/bin/pyvmm-oci") == 2

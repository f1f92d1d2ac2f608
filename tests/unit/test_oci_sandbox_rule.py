"""A pod sandbox goes to runc by one rule, which the native front end
(csrc/oci_runc.h) and the Python runtime (pyvmm/oci/runtime.py) both
apply: for the same config.json or ROOT/.runc entry, the same runc call
with the same arguments, or none. The front end decides the plain cases
itself, without starting the interpreter; where it is not sure, the
Python runtime decides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyvmm

NATIVE = Path(pyvmm.__file__).parent / "_oci"
TYPE, CRIO = "io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# (config.json's text, a sandbox?, does the front end know it alone?)
CONFIGS = {
    "cri": (json.dumps({"annotations": {TYPE: "sandbox"}}), True, True),
    "cri-o": (json.dumps({"annotations": {CRIO: "sandbox"}}), True, True),
    "a container": (json.dumps({"annotations": {TYPE: "container"}}), False, True),
    "no annotations": ("{}", False, True),
    "null annotations": ('{"annotations": null}', False, True),
    "a list": (json.dumps({"annotations": ["sandbox"]}), False, True),
    "another case": (json.dumps({"annotations": {TYPE: "Sandbox"}}), False, True),
    "not a string": (json.dumps({"annotations": {TYPE: True}}), False, True),
    "escaped": (
        '{"annotations": {"io.kubernetes.cri\\u002econtainer-type": "sandbo\\u0078"}}',
        True,
        True,
    ),
    "repeated, last not": (
        f'{{"annotations": {{"{TYPE}": "sandbox", "{TYPE}": "x"}}}}',
        False,
        True,
    ),
    "repeated, last is": (f'{{"annotations": {{"{TYPE}": "x", "{TYPE}": "sandbox"}}}}', True, True),
    "annotations twice": (
        f'{{"annotations": {{"{TYPE}": "sandbox"}}, "annotations": {{}}}}',
        False,
        True,
    ),
    "elsewhere": (json.dumps({"process": {"annotations": {TYPE: "sandbox"}}}), False, True),
    "cut short": (f'{{"annotations": {{"{TYPE}": "sandbox"}}', False, True),
    "trailing text": (f'{{"annotations": {{"{TYPE}": "sandbox"}}}} x', False, True),
    "not an object": (json.dumps([{"annotations": {TYPE: "sandbox"}}]), False, True),
    "deep elsewhere": (
        f'{{"x": {_deep(40)}, "annotations": {{"{TYPE}": "sandbox"}}}}',
        True,
        False,
    ),
}

GLOBALS = ["--log", "LOG", "--log-format", "json", "--rootless=false", "--systemd-cgroup"]


def _stubs(tmp_path: Path) -> tuple[dict, Path]:
    """A runc that notes its arguments, and an interpreter that notes it
    ran before it goes on (the front end's PYVMM_PYTHON)."""
    calls = tmp_path / "calls"
    runc = tmp_path / "runc"
    runc.write_text(
        f'#!/bin/sh\nprintf "runc" >> {calls}\nprintf " %s" "$@" >> {calls}\necho >> {calls}\n'
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho python >> {calls}\nexec {sys.executable} "$@"\n')
    for stub in (runc, python):
        stub.chmod(0o755)
    env = dict(os.environ, PYVMM_OCI_RUNC=str(runc), PYVMM_PYTHON=str(python))
    env.pop("PYVMM_OCI_TRACE", None)
    return env, calls


def _call(front: list[str], args: list[str], env: dict, calls: Path) -> list[str]:
    """What one call did: the runc call (its arguments) and whether the
    interpreter started."""
    if calls.exists():
        calls.unlink()
    subprocess.run([*front, *args], env=env, capture_output=True, timeout=60, check=False)
    return calls.read_text().splitlines() if calls.exists() else []


def _both(tmp_path: Path, args: list[str]) -> tuple[list[str], list[str]]:
    if not os.access(NATIVE, os.X_OK):
        pytest.fail(f"{NATIVE} is missing: run 'python3 setup.py build_ext --inplace'")
    env, calls = _stubs(tmp_path)
    native = _call([str(NATIVE)], args, env, calls)
    python = _call([sys.executable, "-m", "pyvmm.oci"], args, env, calls)
    return native, python


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_create_of_a_sandbox_goes_to_runc_from_both(tmp_path, case):
    text, sandbox, alone = CONFIGS[case]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(text)
    root = tmp_path / "root"
    log = str(tmp_path / "log")
    args = [
        "--root",
        str(root),
        *[log if a == "LOG" else a for a in GLOBALS],
        "create",
        "--bundle",
        str(bundle),
        "--pid-file",
        str(tmp_path / "pid"),
        "pause1",
    ]
    native, python = _both(tmp_path, args)
    runc_call = ["runc --root " + str(root / ".runc") + " " + " ".join(args[2:])]
    assert python == (runc_call if sandbox else [])
    # (a create that is no sandbox is the Python runtime's: the cold create)
    assert native == (python if sandbox and alone else ["python", *python])


@pytest.mark.parametrize(
    "command",
    [
        "state pause1",
        "start pause1",
        "kill --all pause1 9",
        "kill pause1 KILL",
        "delete --force pause1",
        "ps --format json pause1",
    ],
)
def test_every_call_about_runc_s_container_goes_to_runc_from_both(tmp_path, command):
    root = tmp_path / "root"
    (root / ".runc" / "pause1").mkdir(parents=True)
    args = [f"--root={root}", "--log-format", "text", *command.split()]
    native, python = _both(tmp_path, args)
    assert python == ["runc --root " + str(root / ".runc") + " --log-format text " + command]
    assert native == python  # and no interpreter


def test_without_runc_both_say_so_in_one_line(tmp_path):
    root = tmp_path / "root"
    (root / ".runc" / "pause1").mkdir(parents=True)
    env = dict(os.environ, PYVMM_OCI_RUNC=str(tmp_path / "no-runc"))
    for front in ([str(NATIVE)], [sys.executable, "-m", "pyvmm.oci"]):
        done = subprocess.run(
            [*front, "--root", str(root), "state", "pause1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            "pyvmm-oci: a pod sandbox container needs runc, which is not installed\n"
        )

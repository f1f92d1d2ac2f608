"""Behaviour of the launcher's smaller pieces that their mutants showed no
test checked: ``pyvmm snapshot``'s client (serve/client.py) and the API's
request schemas (serve/openapi.py)."""

from __future__ import annotations

import pytest

from pyvmm.serve import client
from pyvmm.serve.client import ClientError


@pytest.fixture
def calls(monkeypatch):
    """The requests client.snapshot makes; answer[0] is what they get."""
    made: list[tuple] = []
    answer = [(200, {"dir": "/srv/s1", "pages": 12, "ms": 7})]

    def call(path, method, target, body=None, fds=None):
        made.append((path, method, target, body))
        return answer[0]

    monkeypatch.setattr(client, "call", call)
    return made, answer


def test_snapshot_posts_the_absolute_dir_and_prints_one_line(calls, capsys, tmp_path, monkeypatch):
    made, _ = calls
    monkeypatch.chdir(tmp_path)
    assert client.snapshot("/run/api.sock", ["vm1", "snap"]) == 0
    assert made == [
        (
            "/run/api.sock",
            "POST",
            f"{client.API}/vms/vm1/snapshot",
            {"dir": str(tmp_path / "snap"), "stop": False},
        )
    ]
    assert capsys.readouterr().out == (
        "pyvmm: snapshot of VM vm1 written to /srv/s1 (12 pages of memory, 7 ms); "
        "the guest runs on\n"
    )
    assert client.snapshot("/run/api.sock", ["--stop", "vm1", "/abs"]) == 0
    assert made[-1][3] == {"dir": "/abs", "stop": True}
    assert capsys.readouterr().out.endswith("; the VM ends\n")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["-x", "vm1", "d"], "Invalid option: `-x'"),
        (["vm1"], "needs a VM's ID and a new DIR"),
        (["vm1", "d", "e"], "needs a VM's ID and a new DIR"),
        (["--stop", "--stop", "vm1", "d"], "needs a VM's ID and a new DIR"),
    ],
)
def test_snapshot_s_bad_arguments_are_one_line_and_nothing_is_sent(calls, args, why):
    made, _ = calls
    with pytest.raises(ClientError, match=why):
        client.snapshot("/run/api.sock", args)
    assert made == []


@pytest.mark.parametrize(
    ("answer", "line"),
    [
        ((409, {"error": "pyvmm: VM vm1 is not running"}), "VM vm1 is not running"),
        ((200, ["not", "an", "object"]), "the launcher answered 200"),
        ((200, None), "the launcher answered 200"),
    ],
)
def test_snapshot_s_refusal_or_a_bad_answer_is_one_line(calls, capsys, answer, line):
    _, answers = calls
    answers[0] = answer
    with pytest.raises(ClientError) as caught:
        client.snapshot("/run/api.sock", ["vm1", "/abs"])
    assert str(caught.value) == line
    assert capsys.readouterr().out == ""


SNAPSHOT_BODIES = [
    {"dir": "/srv/s1"},
    {"dir": "/srv/s1", "stop": True},
    {"dir": "/srv/s1", "stop": False},
    {"dir": "/srv/s1", "extra": 1},
    {"dir": "/srv/s1", "Stop": True},
    {"stop": True},
    {"dir": ""},
    {"dir": "/srv/s1", "stop": "yes"},
    {"dir": 5},
]


@pytest.mark.parametrize("body", SNAPSHOT_BODIES, ids=range(len(SNAPSHOT_BODIES)))
def test_the_snapshot_schema_takes_the_bodies_the_launcher_takes(body):
    """GET /openapi.json's Snapshot request schema and POST /vms/ID/snapshot's
    own check (serve/snapshot.py) agree, unknown keys included."""
    from jsonschema.exceptions import ValidationError
    from openapi_schema_validator import OAS31Validator, validate

    from pyvmm.serve.http import HttpError
    from pyvmm.serve.openapi import document
    from pyvmm.serve.snapshot import checked_request

    doc = document()
    schema = {"$ref": "#/components/schemas/Snapshot", "components": doc["components"]}
    try:
        validate(body, schema, cls=OAS31Validator)
        described = True
    except ValidationError:
        described = False
    try:
        checked_request(body, 4095)
        taken = True
    except HttpError:
        taken = False
    assert described == taken


# -- serve/child.py: the VM's process -------------------------------------------


class _Snapshot:
    """Stands for a Restore or a Snapshotter: only its identity matters."""

    closed = False

    def close(self) -> None:
        self.closed = True


def _launcher_vmm(restore=None):
    import contextlib

    from pyvmm.serve.child import _LauncherVmm

    vmm = object.__new__(_LauncherVmm)  # the methods only, no VM
    vmm._restore = restore
    vmm.stack = contextlib.ExitStack()
    vmm.snapshot = None
    vmm.snapshotter = None
    vmm._on_first_run = lambda: None
    return vmm


def test_a_launched_restore_uses_the_snapshot_the_launcher_read_and_checked(tmp_path):
    """The child never reads the directory again (it may have changed since
    the launcher checked it): the launcher's Restore is the one used, and
    closed with the VM."""
    from pyvmm.vm.config import VmConfig

    checked = _Snapshot()
    vmm = _launcher_vmm(restore=checked)
    config = VmConfig(kernel="k.hvt", restore=str(tmp_path / "gone"))
    assert vmm._open_snapshot(config) is checked
    assert not checked.closed
    vmm.stack.close()
    assert checked.closed


def test_the_launcher_s_snapshotter_wraps_the_run_unless_snapshot_at_does(monkeypatch):
    from pyvmm.vm.vmm import Vmm

    seen = []
    monkeypatch.setattr(Vmm, "_loop", lambda self: seen.append(self.snapshot) or 0)
    vmm = _launcher_vmm()
    vmm.snapshotter = _Snapshot()
    assert vmm._loop() == 0
    assert seen == [vmm.snapshotter]
    at = _Snapshot()  # --snapshot-at's target: the VM's own trigger stays
    vmm = _launcher_vmm()
    vmm.snapshot, vmm.snapshotter = at, _Snapshot()
    vmm._loop()
    assert seen[-1] is at
    vmm = _launcher_vmm()  # nothing to take: no wrapper
    vmm._loop()
    assert seen[-1] is None


def test_the_vm_reads_the_launcher_s_longest_snapshot_request_whole():
    """A "dir" of PATH_MAX bytes that JSON escapes six to one (control
    characters, "\\u0001") makes a request of about 24 KiB: the VM's side of
    the channel (a SOCK_SEQPACKET, where a short read cuts the packet)
    reads it whole, so the snapshot is taken, not given up as bad JSON."""
    import socket

    from pyvmm.serve.child import _Channel
    from pyvmm.serve.snapshot import Taking

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    asked: list[bytes] = []
    channel = object.__new__(_Channel)  # its request handling only
    channel.fd = theirs.fileno()
    channel.snapshotter = type("S", (), {"asked": lambda self, packet: asked.append(packet)})()
    path = "/" + "\x01" * 4094
    taking = object.__new__(Taking)  # its request only: no directory made
    taking.path, taking.stop = path, False
    request = taking.request()
    assert len(request) > 6 * 4094
    try:
        ours.send(request)
        assert channel._answer()
        assert asked == [request]
    finally:
        ours.close()
        theirs.close()

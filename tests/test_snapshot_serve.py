"""Snapshots through the warm launcher: POST /vms/ID/snapshot of a running
VM, a restore through POST /vms {"restore": DIR}, pools of clones of one
snapshot that share its memory, and every bad request refused with one
line and an HTTP 4xx (docs/snapshots.md, "Through the launcher")."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_serve import Described, Launcher, wait_for

from conftest import ROOT, guest, run_pyvmm
from testkit import smaps

pytestmark = pytest.mark.kvm

MEM = "--mem=8"
#: resume.hvt: 32 KiB of heap folded before and after a wait of 3 s.
RESUME = ("4096", "3000")
#: compute.hvt: 512 KiB folded 10000 times, about 1.3 s with no exit at all.
COMPUTE = ("512", "10000")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    subprocess.run(["make", "-C", str(ROOT / "guests"), "-s", "bin/resume.hvt"], check=True)
    server = Launcher(tmp_path_factory.mktemp("snapserve"))
    yield server
    assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


def started(launcher: Launcher, out: Path, *argv: str, **extra) -> dict:
    status, vm = launcher.create(*argv, stdout=str(out), cwd=str(ROOT), **extra)
    assert status == 201, vm
    return vm


def snapshot(launcher: Launcher, vm: dict, directory: Path, stop: bool) -> dict:
    body = {"dir": str(directory), "stop": stop}
    status, answer = launcher.api("POST", f"/v1/vms/{vm['id']}/snapshot", body)
    assert status == 200, answer
    return answer


def ended(launcher: Launcher, vm_id: str) -> dict:
    status, vm = launcher.api("GET", f"/vms/{vm_id}/wait")
    assert status == 200, vm
    return vm


def restored(launcher: Launcher, directory: Path, out: Path, **extra) -> dict:
    body = {"restore": str(directory), "stdout": str(out), "wait": True, **extra}
    status, vm = launcher.api("POST", "/v1/vms", body)
    assert status == 200, vm
    return vm


def uninterrupted(kernel: str, *args: str) -> str:
    whole = run_pyvmm(MEM, guest(kernel), *args)
    assert whole.returncode == 0, whole.stderr
    return whole.stdout


@pytest.fixture(scope="module")
def waiting_snapshot(launcher, tmp_path_factory):
    """resume.hvt snapshotted through the API during its wait, stopped."""
    tmp = tmp_path_factory.mktemp("waiting")
    out = tmp / "before"
    vm = started(launcher, out, MEM, guest("resume"), *RESUME)
    wait_for(out, "before:")
    answer = snapshot(launcher, vm, tmp / "snap", stop=True)
    end = ended(launcher, vm["id"])
    assert end["exit_status"] == 0, end
    assert (
        end["error"]
        == f'pyvmm: snapshot written to {tmp / "snap"}; the run ends there ("stop": true)'
    )
    return tmp / "snap", out.read_text(), answer


def test_a_snapshot_of_a_waiting_guest_restores_to_the_uninterrupted_output(
    launcher, waiting_snapshot, tmp_path
):
    directory, before, answer = waiting_snapshot
    assert answer["dir"] == str(directory) and answer["pages"] > 0 and answer["stop"] is True
    assert answer["memory_bytes"] == 8 << 20
    assert stat_mode(directory) == 0o700
    assert {p.name: stat_mode(p) for p in directory.iterdir()} == {
        "snapshot.json": 0o600,
        "cpu.state": 0o600,
        "memory": 0o600,
    }
    whole = uninterrupted("resume", *RESUME)
    vm = restored(launcher, directory, tmp_path / "after")
    assert vm["exit_status"] == 0, vm
    assert before + (tmp_path / "after").read_text() == whole
    cold = run_pyvmm(f"--restore={directory}")  # the command restores it too
    assert cold.returncode == 0, cold.stderr
    assert before + cold.stdout == whole


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_a_computing_guest_is_stopped_between_two_exits_and_runs_on(launcher, tmp_path):
    """compute.hvt makes no exit while it folds: the kick stops it anyway;
    without "stop" it runs on to the end, and its snapshot, restored, ends
    with the same checksum."""
    out = tmp_path / "out"
    vm = started(launcher, out, "--mem=64", guest("compute"), *COMPUTE)
    time.sleep(0.3)
    answer = snapshot(launcher, vm, tmp_path / "snap", stop=False)
    assert answer["vm"]["state"] == "running"
    assert ended(launcher, vm["id"])["exit_status"] == 0
    whole = run_pyvmm("--mem=64", guest("compute"), *COMPUTE)
    assert whole.returncode == 0, whole.stderr

    def lasting(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("elapsed_us")]

    assert lasting(out.read_text()) == lasting(whole.stdout)
    again = restored(launcher, tmp_path / "snap", tmp_path / "again")
    assert again["exit_status"] == 0, again
    assert lasting((tmp_path / "again").read_text()) == lasting(whole.stdout)


def memory_mapping(pid: int, directory: Path) -> smaps.Mapping:
    """The clone's mapping of the snapshot's memory file (the largest, if
    page protections split it)."""
    path = os.path.realpath(directory / "memory")
    found = [m for m in smaps.read(pid) if m.path == path]
    assert found, f"pid {pid} maps no {path}"
    assert all(m.perms.endswith("p") for m in found)  # MAP_PRIVATE
    totals = smaps.Mapping(0, 0, "", 0, path)
    for m in found:
        for key, kb in m.kb.items():
            totals.kb[key] = totals.kb.get(key, 0) + kb
    return totals


def pool_ready(launcher: Launcher, size: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pools = launcher.api("GET", "/pool")[1]["pools"]
        if pools and pools[0]["ready"] == size:
            return
        assert not pools or pools[0]["error"] is None, pools
        assert time.monotonic() < deadline, pools
        time.sleep(0.05)


def test_a_pool_of_clones_of_a_snapshot_each_runs_to_the_right_end(
    launcher, waiting_snapshot, tmp_path
):
    directory, before, _ = waiting_snapshot
    memory = directory / "memory"
    digest = hashlib.sha256(memory.read_bytes()).hexdigest()
    status, pool = launcher.api("POST", "/v1/pool", {"restore": str(directory), "size": 2})
    assert status == 201, pool
    try:
        pool_ready(launcher, 2)
        whole = uninterrupted("resume", *RESUME)
        for i in range(3):  # two from the pool, a third from its refill or a fork
            out = tmp_path / f"clone{i}"
            vm = restored(launcher, directory, out)
            assert vm["exit_status"] == 0, vm
            assert vm.get("pooled") is True or i == 2, vm
            assert before + out.read_text() == whole
    finally:
        launcher.api("DELETE", "/pool")
    assert hashlib.sha256(memory.read_bytes()).hexdigest() == digest  # written only in copies


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """bigsink_idle.hvt stopped at its first wait (4 MiB of table read and
    256 KiB of heap written at boot); a clone, restored, rewrites its heap
    at once and holds it 30 s."""
    subprocess.run(["make", "-C", str(ROOT / "guests"), "-s", "bin/bigsink_idle.hvt"], check=True)
    directory = tmp_path_factory.mktemp("template") / "t"
    taken = run_pyvmm(
        "--mem=16",
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        guest("bigsink_idle"),
        "256",
        "1",
        "30000",
    )
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout == "table: 1024 pages read\nheap: 256 KiB written\n"
    return directory


def test_clones_share_the_pages_they_did_not_write_and_keep_their_writes(
    launcher, template, tmp_path
):
    memory = template / "memory"
    digest = hashlib.sha256(memory.read_bytes()).hexdigest()
    status, pool = launcher.api("POST", "/v1/pool", {"restore": str(template), "size": 2})
    assert status == 201, pool
    clones = []
    try:
        pool_ready(launcher, 2)
        for i in range(2):
            out = tmp_path / f"clone{i}"
            status, vm = launcher.api(
                "POST", "/v1/vms", {"restore": str(template), "stdout": str(out)}
            )
            assert status == 201 and vm.get("pooled") is True, vm
            clones.append(vm)
            wait_for(out, "rewritten: 256 KiB")
        for vm in clones:
            mapping = memory_mapping(vm["pid"], template)
            # What it read (code, data), the page cache's: shared by both.
            assert mapping["Shared_Clean"] > 0, mapping.kb
            # The table read at boot is not read again: never loaded.
            assert mapping["Rss"] < 4096, mapping.kb
            # The heap's 64 pages, written again by each: its own copies.
            assert 256 <= mapping["Private_Dirty"] < 1024, mapping.kb
            assert mapping["Pss"] < mapping["Rss"], mapping.kb
    finally:
        for vm in clones:
            launcher.api("POST", f"/vms/{vm['id']}/stop")
        launcher.api("DELETE", "/pool")
    assert hashlib.sha256(memory.read_bytes()).hexdigest() == digest


# -- refusals ------------------------------------------------------------------


def refused(launcher: Launcher, target: str, body, status: int = 400) -> str:
    got, answer = launcher.api("POST", target, body)
    assert got == status, answer
    assert set(answer) == {"error", "exit_status"}, answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    return answer["error"]


def test_bad_snapshot_requests_are_refused_with_one_line(launcher, waiting_snapshot, tmp_path):
    directory, _, _ = waiting_snapshot
    out = tmp_path / "out"
    vm = started(launcher, out, MEM, guest("resume"), *RESUME)
    wait_for(out, "before:")
    target = f"/v1/vms/{vm['id']}/snapshot"
    assert "exists" in refused(launcher, target, {"dir": str(directory)})
    assert "absolute" in refused(launcher, target, {"dir": "relative/snap"})
    assert "cannot create" in refused(launcher, target, {"dir": str(tmp_path / "no" / "s")})
    assert '"dir"' in refused(launcher, target, {})
    assert '"stop"' in refused(launcher, target, {"dir": str(tmp_path / "s"), "stop": 1})
    assert "unknown key" in refused(launcher, target, {"dir": str(tmp_path / "s"), "x": 1})
    assert not (tmp_path / "s").exists()
    refused(launcher, "/v1/vms/nosuch/snapshot", {"dir": str(tmp_path / "s")}, 404)
    # It still runs, and a good request after the bad ones is taken.
    assert snapshot(launcher, vm, tmp_path / "good", stop=True)["pages"] > 0
    assert ended(launcher, vm["id"])["exit_status"] == 0
    ended_line = refused(launcher, target, {"dir": str(tmp_path / "late")}, 409)
    assert "exited" in ended_line and not (tmp_path / "late").exists()


def test_a_vm_with_its_own_snapshot_trigger_is_refused_and_no_directory_stays(launcher, tmp_path):
    """A VM whose snapshot cannot be taken (its own --snapshot-at) is
    refused by its process, and the launcher removes the directory."""
    out = tmp_path / "out"
    own = tmp_path / "own"
    vm = started(
        launcher,
        out,
        MEM,
        "--snapshot-at=sigusr2",
        f"--snapshot-dir={own}",
        guest("resume"),
        *RESUME,
    )
    wait_for(out, "before:")
    line = refused(launcher, f"/vms/{vm['id']}/snapshot", {"dir": str(tmp_path / "s")}, 409)
    assert "--snapshot-at" in line and not (tmp_path / "s").exists()
    launcher.api("POST", f"/vms/{vm['id']}/stop")


def test_bad_restores_are_refused_with_the_commands_line(launcher, waiting_snapshot, tmp_path):
    directory, _, _ = waiting_snapshot
    missing = refused(launcher, "/v1/vms", {"restore": str(tmp_path / "none")})
    assert missing.startswith("pyvmm: --restore: ")
    corrupt = tmp_path / "corrupt"
    os.mkdir(corrupt, 0o700)
    for part in directory.iterdir():
        (corrupt / part.name).write_bytes(part.read_bytes())
        os.chmod(corrupt / part.name, 0o600)
    meta = json.loads((corrupt / "snapshot.json").read_text())
    meta["plan"]["mem_size"] += 1 << 21  # the checksum no longer agrees
    (corrupt / "snapshot.json").write_text(json.dumps(meta))
    assert "checksum" in refused(launcher, "/v1/vms", {"restore": str(corrupt)})
    foreign = tmp_path / "foreign"
    os.mkdir(foreign, 0o700)
    (foreign / "snapshot.json").write_text('{"format": "not-pyvmm"}')
    os.chmod(foreign / "snapshot.json", 0o600)
    assert refused(launcher, "/v1/vms", {"restore": str(foreign)}).startswith("pyvmm: --restore")
    assert "not declared" in refused(
        launcher, "/v1/vms", {"restore": str(directory), "argv": ["--block:disk=/nonexistent"]}
    )
    assert "argv" in refused(launcher, "/v1/vms", {"restore": str(directory), "argv": "x"})
    refused(launcher, "/v1/pool", {"restore": str(tmp_path / "none")})
    assert launcher.api("GET", "/pool")[1]["pools"] == []


def test_the_snapshot_route_answers_as_the_openapi_document_says(
    launcher, waiting_snapshot, tmp_path
):
    api = Described(launcher)
    out = tmp_path / "out"
    vm = started(launcher, out, MEM, guest("resume"), *RESUME)
    wait_for(out, "before:")
    target = f"/v1/vms/{vm['id']}/snapshot"
    api("POST", target, {"dir": "relative"}, expect=400)
    api("POST", target, {"dir": str(tmp_path / "s"), "stop": True}, expect=200)
    api("POST", "/v1/vms", {"restore": str(tmp_path / "s"), "wait": True}, expect=200)
    assert ("POST", "/vms/{id}/snapshot") in api.seen

    # The requests' own bodies, as the document describes them.
    from openapi_schema_validator import OAS31Validator

    def valid(schema: str, body: dict) -> bool:
        ref = {"$ref": f"#/components/schemas/{schema}", "components": api.doc["components"]}
        return OAS31Validator(ref).is_valid(body)

    assert valid("CreateVm", {"restore": str(tmp_path / "s"), "wait": True})
    assert valid("CreateVm", {"restore": "s", "argv": ["--block:disk=d.img"]})
    assert valid("CreateVm", {"argv": ["x.hvt"]}) and not valid("CreateVm", {"wait": True})
    assert valid("CreatePool", {"restore": "s", "size": 2}) and not valid("CreatePool", {})
    assert valid("Snapshot", {"dir": "/s", "stop": True}) and not valid("Snapshot", {"stop": 1})


def test_the_snapshot_command_writes_one_of_a_running_vm(launcher, tmp_path):
    """``pyvmm snapshot --api-sock PATH [--stop] ID DIR``: DIR taken from
    the command's own directory, one line on stdout; its errors one line
    and status 1."""
    out = tmp_path / "out"
    vm = started(launcher, out, MEM, guest("resume"), *RESUME)
    wait_for(out, "before:")
    command = ("snapshot", "--api-sock", launcher.path)

    def run_pyvmm(*args: str, cwd: Path) -> subprocess.CompletedProcess:  # in the test's own dir
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "pyvmm", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)

    taken = run_pyvmm(*command, vm["id"], "snap", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.startswith(f"pyvmm: snapshot of VM {vm['id']} written to {tmp_path}/snap")
    assert (tmp_path / "snap" / "snapshot.json").exists()
    again = run_pyvmm(*command, vm["id"], "snap", cwd=tmp_path)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "exists" in again.stderr
    for bad in ([vm["id"]], ["--now", vm["id"], "x"], ["nosuch", "x"]):
        wrong = run_pyvmm(*command, *bad, cwd=tmp_path)
        assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr
        assert wrong.stderr.startswith("pyvmm: ") and "Traceback" not in wrong.stderr
    stopped = run_pyvmm(*command, "--stop", vm["id"], "last", cwd=tmp_path)
    assert stopped.returncode == 0 and stopped.stdout.endswith("the VM ends\n"), stopped.stderr
    assert ended(launcher, vm["id"])["exit_status"] == 0
    assert "pyvmm snapshot --api-sock PATH [--stop] ID DIR" in run_pyvmm("--help", cwd=ROOT).stdout


def test_bench_snapshot_quick_prints_every_row_and_leaves_nothing(tmp_path):
    """bench/snapshot.py in its smallest run: every row printed, its JSON
    written, and no launcher, VM or directory of its own left behind."""
    before = set(Path(tempfile.gettempdir()).glob("pyvmm-bench-snapshot-*"))
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "snapshot.py"), "--runs", "1", "--clones", "2",
         "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for row in (
        "request -> files written and synced",
        "cold pyvmm --restore: snapshot opened -> first instruction",
        "serve, fork per request: restore",
        "serve, from a pool: restore",
        "template clones (restore)",
        "booted from scratch",
    ):
        assert row in result.stdout, result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["density"]["clones"]["pss_mib"]["median"] > 0
    assert set(Path(tempfile.gettempdir()).glob("pyvmm-bench-snapshot-*")) == before


@pytest.mark.netns
@pytest.mark.parametrize("path", ["--shm=event", "--shm=off"])
def test_a_networked_vm_snapshotted_through_the_api_answers_on_a_new_tap(tmp_path, path):
    """The ping guest answers two echo requests, is snapshotted through the
    API (its IO thread paused with it) and restored through POST /vms on
    another tap: it answers two more and counts four. All of it inside a
    namespace of the test's own, with the launcher in it."""
    from testkit import helpers
    from testkit.netns import NetNamespace

    mac, ip = "02:00:00:00:00:2b", "10.0.0.2"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        server = Launcher(tmp_path, popen=ns.popen)
        try:
            out = tmp_path / "before"
            argv = ["--mem=32", path, "--net:service0=tap100", f"--net-mac:service0={mac}"]
            vm = started(server, out, *argv, guest("ping"), ip, "4")
            helpers.ping(ns, ip, 2)
            snapshot(server, vm, tmp_path / "snap", stop=True)
            assert ended(server, vm["id"])["exit_status"] == 0
            ns.run(["ip", "link", "del", "tap100"], check=True)
            ns.add_tap("tap101", address="10.0.0.1/24")
            after = tmp_path / "after"
            body = {"restore": str(tmp_path / "snap"), "argv": ["--net:service0=tap101"]}
            status, clone = server.api("POST", "/v1/vms", {**body, "stdout": str(after)})
            assert status == 201, clone
            helpers.ping(ns, ip, 2)
            assert ended(server, clone["id"])["exit_status"] == 0
            # The kick ends the poll it cuts short as an early wake-up with
            # nothing ready; a frame that reaches the restored guest before
            # its next poll makes it say so (its own check of the ready set).
            early = "ping: warning: a frame was waiting but poll did not report the device ready\n"
            assert after.read_text().removeprefix(early) == "answered 4 echo requests\nSUCCESS\n"
        finally:
            assert server.stop() == 128 + signal.SIGTERM


def test_a_restored_vm_snapshotted_again_keeps_the_pages_it_never_touched(launcher, tmp_path):
    """A clone's guest memory is the template's file, MAP_PRIVATE: the 4 MiB
    table it never read again are the file's pages, not in its page map
    (1023 whole pages of it: the table is not page-aligned);
    its own snapshot has them all the same (and it resumes)."""
    first = tmp_path / "first"
    out = tmp_path / "out"
    vm = started(launcher, out, "--mem=16", guest("bigsink_idle"), "256", "4000", "0")
    wait_for(out, "heap:")
    pages = snapshot(launcher, vm, first, stop=True)["pages"]
    clone = launcher.api("POST", "/v1/vms", {"restore": str(first), "stdout": str(tmp_path / "c")})
    assert clone[0] == 201, clone
    second = tmp_path / "second"
    again = snapshot(launcher, clone[1], second, stop=True)
    assert again["pages"] >= pages - 8, (again, pages)
    memory = (second / "memory").read_bytes()
    table = bytes([0x3C]) * 4096
    assert sum(memory[i : i + 4096] == table for i in range(0, len(memory), 4096)) >= 1023
    end = restored(launcher, second, tmp_path / "end")
    assert end["exit_status"] == 0, end
    assert (tmp_path / "end").read_text() == "rewritten: 256 KiB\nSUCCESS\n"

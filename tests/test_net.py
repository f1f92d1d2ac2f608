"""Network end to end, inside a network namespace the test creates and
removes: a tap in it, pyvmm running in it, the sender in it."""

from __future__ import annotations

import subprocess

import pytest

from conftest import ROOT, engine_env, guest
from testkit.netns import NetNamespace, can_create_namespaces

pytestmark = [
    pytest.mark.kvm,
    pytest.mark.skipif(not can_create_namespaces(), reason="needs root and /dev/net/tun"),
]

GUEST_IP = "10.0.0.2"


def start_guest(ns: NetNamespace, *args: str, **kwargs) -> tuple[subprocess.Popen, str]:
    """pyvmm in the namespace, once the guest listens."""
    return ns.start_pyvmm(*args, cwd=ROOT, **kwargs)


def ping(ns: NetNamespace, count: int) -> subprocess.CompletedProcess:
    """Ping the guest from inside the namespace; asserts every reply came."""
    result = ns.run(
        ["ping", "-c", str(count), "-i", "0.2", "-W", "5", GUEST_IP],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{count} received" in result.stdout
    return result


@pytest.mark.parametrize("engine", ["c", "python"])
def test_guest_answers_ping_over_tap(engine):
    """Over the plain hypercall path, answered by the C fast path or (as the
    fast path does for anything unclean) by Python."""
    env = engine_env(engine)
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = start_guest(
            ns, "--shm=off", "--net:service0=tap100", guest("ping"), GUEST_IP, "3", env=env
        )
        ping(ns, 3)
        out, err = vm.communicate(timeout=60)
        assert vm.returncode == 0, out + err
        assert "SUCCESS" in out


def test_short_net_option_and_guest_sees_real_mtu():
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24", mtu=1400)
        vm, head = start_guest(
            ns,
            "--net=tap100",
            "--net-mac:service0=02:00:00:00:00:2a",
            guest("ping"),
            GUEST_IP,
            "1",
        )
        ping(ns, 1)
        out, err = vm.communicate(timeout=60)
        out = head + out
        assert vm.returncode == 0, out + err
        assert "MTU: 1400" in out
        assert "02:00:00:00:00:2a" in out.lower()


def test_tap_passed_as_open_file_descriptor():
    """--net:NAME=@FD, as orchestrators pass an already opened tap."""
    from pyvmm.devices.net.tap import TapBackend

    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        with ns.inside():
            tap = TapBackend.open("tap100")
        fd = tap.fileno()
        try:
            vm, head = start_guest(
                ns, f"--net:service0=@{fd}", guest("ping"), GUEST_IP, "2", pass_fds=(fd,)
            )
        finally:
            tap.close()  # pyvmm holds its own copy now
        ping(ns, 2)
        out, err = vm.communicate(timeout=60)
        assert vm.returncode == 0, head + out + err


def test_legacy_abi_guest_answers_ping_over_hypercalls(tmp_path):
    """An ABI version 1 unikernel (Solo5 0.9 and older) under --legacy-abi:
    no ring offered, frames go through the net hypercalls."""
    blob = bytearray(guest("ping").read_bytes())
    desc = blob.index((0x31494241).to_bytes(4, "little")) + 4 + 8  # ABI1 note descriptor
    blob[desc + 4 : desc + 8] = (1).to_bytes(4, "little")  # abi_version
    path = tmp_path / "ping-abi1.hvt"
    path.write_bytes(bytes(blob))
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = start_guest(ns, "--legacy-abi", "--net=tap100", str(path), GUEST_IP, "2")
        ping(ns, 2)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, head + out + err
    assert "path: hypercall" in head


BAD_CALLS = {
    # case: (exit status, what stderr's one line or stdout must say)
    "walltime_ro": (1, "bad pointer in walltime hypercall"),
    "poll_out": (1, "bad pointer in poll hypercall"),
    "read_ro": (1, "is read-only memory"),
    "read_out": (1, "is outside guest memory"),
    "write_out": (1, "bad pointer in net_write hypercall"),
    "write_big": (0, "ret: 2"),
    "read_handle": (0, "ret: 2"),
}


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_per_frame_hypercalls_get_the_same_answer_from_c_and_python(case, engine):
    """The C fast path (csrc/hcfast.c) answers only clean hypercalls and
    hands the rest to Python: a bad pointer stops the guest with Python's
    one-line message, a bad handle or length gets EINVAL, either way."""
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        result = ns.run_pyvmm(
            "--shm=off", "--net=tap100", guest("badcall"), case, cwd=ROOT, env=engine_env(engine)
        )
    status, words = BAD_CALLS[case]
    assert result.returncode == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "FAILURE" not in result.stdout
    if status:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pyvmm: guest fault"), result.stderr
        assert words in lines[0], lines[0]
    else:
        assert words in result.stdout.splitlines() and "SUCCESS" in result.stdout

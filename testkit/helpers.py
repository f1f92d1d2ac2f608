"""What several tests need, written once: frame patterns, the --stats line
parser, the ping invocation, patching a guest's ABI note, a test's own
guest built against guests/runtime, values the command line refuses, and
code run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- frames -------------------------------------------------------------------

# A payload source: frame n is its number followed by a slice of this, so a
# frame left over from another index never looks like the expected one.
_PATTERN = bytes(i % 251 for i in range(2 * 2048 + 70000))


def frame(seq: int, length: int) -> bytes:
    """Frame number ``seq`` of ``length`` bytes: its number (8 bytes, little
    endian), then a pattern that depends on it."""
    head = seq.to_bytes(8, "little")
    return (head + _PATTERN[seq % 251 : seq % 251 + length])[:length]


def udp_payload(seq: int, size: int) -> bytes:
    """The payload testkit.traffic sends and guests/udpsink checks: bytes
    0-7 the little-endian sequence number, byte i >= 8 is (seq + i) & 0xff."""
    return seq.to_bytes(8, "little") + bytes((seq + i) & 0xFF for i in range(8, size))


# -- pyvmm's output -------------------------------------------------------------

#: The option that makes pyvmm write its counters as one JSON line on
#: stderr at exit (appended: /dev/stderr is never truncated), for
#: parse_stats.
STATS = "--stats-json=/dev/stderr"
STATS_SCHEMA = '"schema": "pyvmm-stats/1"'


def parse_stats(stderr: str) -> dict[str, Any]:
    """The JSON counters pyvmm wrote on stderr with STATS (exactly one line)."""
    lines = [line for line in stderr.splitlines() if STATS_SCHEMA in line]
    assert len(lines) == 1, f"expected one JSON counters line in: {stderr!r}"
    return json.loads(lines[0])


def guest_report(stdout: str) -> dict[str, str]:
    """The guest's ``key: value`` lines (values without spaces)."""
    report = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isidentifier() and value and " " not in value:
            report[key] = value
    return report


def check_bad_call(result: subprocess.CompletedProcess, status: int, words: str) -> None:
    """How pyvmm answers a guest's bad hypercall (guests/badcall, badblock):
    a non-zero ``status`` is a stop with one ``pyvmm: guest fault`` line
    saying ``words``; zero means the guest got an error code back, printed
    ``words`` and went on to SUCCESS. Never a traceback, never FAILURE."""
    assert result.returncode == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "FAILURE" not in result.stdout
    if status:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pyvmm: guest fault"), result.stderr
        assert words in lines[0], lines[0]
    else:
        assert words in result.stdout.splitlines() and "SUCCESS" in result.stdout


# -- the network -----------------------------------------------------------------


def ping(
    ns: Any, address: str, count: int, interval: float = 0.2, wait: int = 5
) -> subprocess.CompletedProcess:
    """Ping ``address`` from inside the namespace ``ns`` (a NetNamespace);
    asserts every reply came. ``wait``: seconds for the first reply."""
    result = ns.run(
        ["ping", "-c", str(count), "-i", str(interval), "-W", str(wait), address],
        capture_output=True,
        text=True,
        timeout=wait + 55,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{count} received" in result.stdout, result.stdout
    return result


def restored_on_tap(
    ns: Any, vm: subprocess.Popen, tap: str, address: str, snapshot: Path, timeout: float = 30
) -> None:
    """Wait until the restoring pyvmm ``vm`` has ``tap`` open and the kernel
    passes frames to it (NetNamespace.passes_frames), then make the guest
    at ``address`` a permanent neighbour there, with the MAC it keeps from
    the ``snapshot`` directory (its first net device's).

    Neither is the tap's NO-CARRIER flag gone: that flag follows the
    kernel's link watch, which can still show a new tap's state from before
    (in an emulated machine, echo requests sent then were dropped unseen).
    An open tap is not a running guest either: between the two the restore
    sets up the vCPU, seconds in an emulated machine. With the address
    known, the requests wait in the tap's queue until the guest reads them
    (no ARP to give up meanwhile), so a ping with a long enough ``wait``
    needs no guess of how long the start takes.
    """
    net = json.loads((snapshot / "snapshot.json").read_text())["device_state"]["net"]
    mac = net["devices"][0]["mac"]
    deadline = time.monotonic() + timeout
    while not ns.passes_frames(tap):
        if vm.poll() is not None or time.monotonic() > deadline:
            vm.kill()
            out, err = vm.communicate()
            raise AssertionError(f"the restore never opened {tap}: {out}{err}")
        time.sleep(0.01)
    ns.add_neighbour(tap, address, mac)


# -- unikernel files ---------------------------------------------------------------

GUEST_SRC = Path(__file__).resolve().parents[1] / "guests"


def _make_var(name: str) -> list[str]:
    """A variable of guests/Makefile, so a test's guest builds as the others do."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "print-%: ; @echo $($*)", f"print-{name}"],
        cwd=GUEST_SRC,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def build_runtime_guest(source: str, out: Path, name: str) -> Path:
    """``out/NAME.hvt`` from C ``source``, compiled and linked against the
    built guest runtime with guests/Makefile's own flags; AssertionError if
    the runtime is not built (``make -C guests``)."""
    (out / f"{name}.c").write_text(source)
    cflags = [f for f in _make_var("CFLAGS") if f not in ("-MMD", "-MP")]
    lib = _make_var("LIB")
    objects = _make_var("ALWAYS_OBJS") + lib
    assert all((GUEST_SRC / o).exists() for o in objects), (
        "the guest runtime is not built: run 'make -C guests' first"
    )
    obj, binary = out / f"{name}.o", out / f"{name}.hvt"
    subprocess.run(["gcc", *cflags, "-c", "-o", obj, out / f"{name}.c"], cwd=GUEST_SRC, check=True)
    subprocess.run(
        ["gcc", *_make_var("LDFLAGS"), "-o", binary, *objects[:-1], obj]
        + lib
        + _make_var("LDLIBS"),
        cwd=GUEST_SRC,
        check=True,
    )
    return binary


ABI1_NOTE_TYPE = 0x31494241  # "ABI1"
MANIFEST_NOTE_TYPE = 0x3154464D  # "MFT1"


def abi_version_offset(blob: bytes) -> int:
    """File offset of the abi_version field of the Solo5 ABI note: after the
    note's type word comes its name "Solo5\\0\\0\\0", then the descriptor,
    whose second word is the version."""
    return blob.index(struct.pack("<I", ABI1_NOTE_TYPE)) + 4 + 8 + 4


def patch(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    """A copy of ``src`` at ``dst`` with ``data`` written at ``offset``."""
    blob = bytearray(src.read_bytes())
    blob[offset : offset + len(data)] = data
    dst.write_bytes(bytes(blob))
    return dst


def with_abi_version(src: Path, dst: Path, version: int) -> Path:
    """A copy of the guest ``src`` whose ABI note claims ``version``."""
    offset = abi_version_offset(src.read_bytes())
    return patch(src, dst, offset, struct.pack("<I", version))


# -- command-line values -------------------------------------------------------------

BAD_CPL = "2"  # neither auto, 0, 3 nor deprivileged
BAD_CPL_MESSAGE = f"pyvmm: --cpl: '{BAD_CPL}' is not one of auto, 0, 3, deprivileged"


def handles_stop_signals(pid: int) -> bool:
    """Whether pyvmm's own stop handlers are in (pyvmm/entry.py): SIGTERM
    caught, read from /proc/PID/status (Python alone does not catch it)."""
    import signal

    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def answer_in_fork(action: Callable[[], str]) -> str:
    """``action()``'s answer from a forked child, for what cannot be undone
    in the test's process (a seccomp filter loaded, another uid taken):
    the child runs no pytest and no clean-up, only the action, and ends."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.write(write, action().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``code`` (dedented) in a fresh interpreter from the repository's
    root, its output captured: for what must not run in the test's own
    process (a SIGBUS met under a guard, a limit lowered for good)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=timeout,
    )

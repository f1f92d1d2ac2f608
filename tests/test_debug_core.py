"""--dumpcore=DIR: a guest that faults or aborts leaves an ELF core that
Debian's gdb reads (the faulting frame, the signal), named on stderr as
solo5-hvt-debug names it; a run that ends well leaves nothing; a bad DIR
is one line before the guest starts. With the sandbox on (the default) and
off, in every privilege mode."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import guest, run_pyvmm

pytestmark = pytest.mark.kvm

CORE_LINE = re.compile(r"^pyvmm: dumpcore: dumping guest core to: (\S+/core\.solo5-hvt\.(\d+))$")
MODES = ("--cpl=0", "--cpl=3", "--cpl=deprivileged")
SANDBOX = ((), ("--no-sandbox",))


def gdb() -> str:
    path = shutil.which("gdb")
    if path is None:
        pytest.fail("gdb is not installed (scripts/setup installs it)")
    return path


def core_of(result: subprocess.CompletedProcess, where: Path) -> Path:
    """The core the output names: in ``where``, its name ending a line."""
    found = [m for line in result.stderr.splitlines() if (m := CORE_LINE.match(line))]
    assert len(found) == 1, result.stderr
    path = Path(found[0].group(1))
    assert path.parent == where, result.stderr
    assert path.is_file(), result.stderr
    return path


def backtrace(kernel: Path, core: Path) -> str:
    out = subprocess.run(
        [gdb(), "-nx", "-batch", "-ex", "bt", "-ex", "info registers rip", str(kernel), str(core)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("sandbox", SANDBOX, ids=("sandboxed", "no-sandbox"))
@pytest.mark.parametrize("mode", MODES)
def test_page_zero_fault_core_shows_the_faulting_function(tmp_path, mode, sandbox):
    result = run_pyvmm(mode, *sandbox, f"--dumpcore={tmp_path}", guest("fault_zeropage"))
    assert result.returncode == 1, result.stderr
    assert "pyvmm: guest fault: access to unmapped page zero" in result.stderr
    core = core_of(result, tmp_path)
    assert core.stat().st_mode & 0o777 == 0o600
    shown = backtrace(guest("fault_zeropage"), core)
    assert "Program terminated with signal SIGSEGV" in shown, shown
    assert re.search(r"^#0 +solo5_app_main \(.*\) at fault_zeropage\.c:\d+", shown, re.M), shown
    assert re.search(r"^#\d+ .* in _start \(\)", shown, re.M), shown
    # The rip gdb read from the note is the one the fault line gives.
    rip = re.search(r"rip=(0x[0-9a-f]+)", result.stderr).group(1)
    assert re.search(rf"^rip +{rip} +{rip} <solo5_app_main\+\d+>", shown, re.M), shown


@pytest.mark.parametrize("mode", MODES)
def test_core_holds_the_sse_and_x87_registers(tmp_path, mode):
    """NT_PRFPREG: gdbtarget faults with known patterns in xmm0/xmm1; gdb
    reads them from the core (`p $xmm0`) and the x87 state (`info float`)."""
    result = run_pyvmm(mode, f"--dumpcore={tmp_path}", "--", guest("gdbtarget"), "fault")
    assert result.returncode == 1, result.stderr
    core = core_of(result, tmp_path)
    commands = ["p/x $xmm0.v4_int32", "p/x $xmm1.v2_int64", "info float"]
    argv = [gdb(), "-nx", "-batch", *(a for c in commands for a in ("-ex", c))]
    shown = subprocess.run(
        [*argv, str(guest("gdbtarget")), str(core)], capture_output=True, text=True, timeout=120
    ).stdout
    assert "$1 = {0x11223344, 0x55667788, 0x99aabbcc, 0xddeeff00}" in shown, shown
    assert "$2 = {0x506070801020304, 0xd0e0f10090a0b0c}" in shown, shown
    assert re.search(r"^=>R0: Empty +0x0{20}$", shown, re.M), shown
    assert re.search(r"^Tag Word: +0xffff$", shown, re.M), shown
    assert re.search(r"^Control Word: +0x037f", shown, re.M), shown


@pytest.mark.parametrize("mode", MODES)
def test_write_to_text_and_execute_data_cores(tmp_path, mode):
    wtext = tmp_path / "wtext"
    xdata = tmp_path / "xdata"
    wtext.mkdir()
    xdata.mkdir()
    result = run_pyvmm(mode, f"--dumpcore={wtext}", guest("fault_wtext"))
    assert result.returncode == 1, result.stderr
    shown = backtrace(guest("fault_wtext"), core_of(result, wtext))
    assert re.search(r"^#0 .*solo5_app_main \(", shown, re.M), shown
    result = run_pyvmm(mode, f"--dumpcore={xdata}", guest("fault_xdata"))
    assert result.returncode == 1, result.stderr
    shown = backtrace(guest("fault_xdata"), core_of(result, xdata))
    # The fetch from data faulted at the data; its caller is the next frame.
    assert re.search(r"^#0 +0x0*103000 in ", shown, re.M), shown
    assert re.search(r"^#1 .* in solo5_app_main \(", shown, re.M), shown


@pytest.mark.parametrize("sandbox", SANDBOX, ids=("sandboxed", "no-sandbox"))
def test_abort_core_has_status_255_and_the_abort_frames(tmp_path, sandbox):
    result = run_pyvmm(*sandbox, f"--dumpcore={tmp_path}", guest("abort"))
    assert result.returncode == 255, result.stderr
    shown = backtrace(guest("abort"), core_of(result, tmp_path))
    assert "Program terminated with signal SIGABRT" in shown, shown
    assert re.search(r"^#\d+ .* in solo5_abort \(\)", shown, re.M), shown
    assert re.search(r"^#\d+ .* in solo5_app_main \(.*\) at abort\.c:\d+", shown, re.M), shown


def test_bad_hypercall_pointer_dumps_too(tmp_path):
    result = run_pyvmm(f"--dumpcore={tmp_path}", guest("fault_badptr"))
    assert result.returncode == 1, result.stderr
    assert "outside guest memory" in result.stderr
    core_of(result, tmp_path)


def test_core_is_elf_with_a_prstatus_note_and_memory_as_load(tmp_path):
    result = run_pyvmm("--mem=8", f"--dumpcore={tmp_path}", guest("fault_zeropage"))
    core = core_of(result, tmp_path).read_bytes()
    assert core[:4] == b"\x7fELF"
    e_type, e_machine = struct.unpack_from("<HH", core, 16)
    assert (e_type, e_machine) == (4, 62)  # ET_CORE, EM_X86_64
    phoff, phnum = struct.unpack_from("<Q", core, 32)[0], struct.unpack_from("<H", core, 56)[0]
    headers = [struct.unpack_from("<IIQQQQQQ", core, phoff + 56 * i) for i in range(phnum)]
    kinds = [h[0] for h in headers]
    assert kinds == [4, 1]  # PT_NOTE, PT_LOAD
    note_off = headers[0][2]
    namesz, descsz, ntype = struct.unpack_from("<III", core, note_off)
    assert (ntype, descsz, core[note_off + 12 : note_off + 16]) == (1, 336, b"CORE")
    fp_off = note_off + 12 + namesz + descsz
    namesz, descsz, ntype = struct.unpack_from("<III", core, fp_off)
    assert (ntype, descsz, core[fp_off + 12 : fp_off + 16]) == (2, 512, b"CORE")  # NT_PRFPREG
    assert struct.unpack_from("<i", core, note_off + 12 + 8 + 328)[0] == 1  # pr_fpvalid
    load = headers[1]
    assert (load[3], load[5], load[6]) == (0, 8 << 20, 8 << 20)  # vaddr 0, all of memory
    assert len(core) == load[2] + load[5]
    # The guest's text is in it, at its address: the file's bytes there.
    text = guest("fault_zeropage").read_bytes()
    assert text[0x1000:0x1040] in core[load[2] + 0x100000 : load[2] + 0x101000]


@pytest.mark.parametrize("sandbox", SANDBOX, ids=("sandboxed", "no-sandbox"))
def test_a_run_that_ends_well_leaves_nothing_in_dir(tmp_path, sandbox):
    result = run_pyvmm(*sandbox, f"--dumpcore={tmp_path}", guest("hello"))
    assert result.returncode == 0, result.stderr
    assert "dumpcore" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_helper_ends_with_pyvmm(tmp_path):
    """The sandboxed run's helper (it names the core) exits when pyvmm does,
    whether or not a core was written."""
    for name in ("hello", "abort"):
        result = run_pyvmm(f"--dumpcore={tmp_path}", guest(name))
        assert result.returncode in (0, 255), result.stderr
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    helpers = [line for line in ps.stdout.splitlines() if "corelink.py" in line]
    # Any left would be of this test's runs (their argv name this test's pids).
    assert not [h for h in helpers if str(tmp_path) in h or "core.solo5-hvt" in h], helpers


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "cannot open the directory: No such file or directory"),
        (lambda p: (p / "file").write_text("") or p / "file", "Not a directory"),
    ],
    ids=("missing", "a file"),
)
def test_bad_dir_is_one_line_before_the_guest_starts(tmp_path, make, message):
    where = make(tmp_path)
    result = run_pyvmm(f"--dumpcore={where}", guest("hello"))
    assert result.returncode == 1
    assert result.stdout == ""  # the guest never ran
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pyvmm: --dumpcore={where}: "), lines
    assert message in lines[0]


def test_dir_the_user_cannot_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    result = run_pyvmm("--user=nobody", f"--dumpcore={locked}", guest("hello"))
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"--dumpcore={locked}" in result.stderr


# -- Solo5's own test_dumpcore, as tests.bats runs it ---------------------------


@pytest.fixture(scope="module")
def solo5():
    from scripts import solo5_build

    try:
        return solo5_build.ensure(log=lambda message: print(f"solo5-build: {message}"))
    except solo5_build.BuildError as err:
        pytest.fail(f"Solo5 from the release archive: {err}")


@pytest.mark.parametrize("bindings", ("hvt", "pyvmm"))
def test_solo5_dumpcore_passes_its_tests_bats_check(solo5, bindings, tmp_path):
    """tests.bats' dumpcore case (status 255, the core the output names in
    DIR), by solo5_check's table; then gdb reads that core: the abort."""
    from scripts import solo5_check

    case = solo5_check.CASE_NAMES["dumpcore"]
    kernel = solo5_check.programs(solo5, bindings) / f"{case.kernel}.hvt"
    tender = solo5_check.make_tender("pyvmm", solo5)
    result = solo5_check.run_case(case, kernel, tender, bindings, 4096, [], 300.0)
    assert result.verdict == "PASS", result.output
    # Run again into a directory of this test's, to read the core.
    run = run_pyvmm("--mem=64", f"--dumpcore={tmp_path}", kernel, timeout=300)
    assert run.returncode == 255, run.stderr
    shown = backtrace(kernel, core_of(run, tmp_path))
    assert re.search(r"^#\d+ .* in solo5_app_main \(", shown, re.M), shown

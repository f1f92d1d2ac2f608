"""A device kind plugs in at the device seam alone: the test-only kind
(testkit/devkind), registered for one process, gets its option, its
manifest type, its hypercall, its IO service in the native IO thread (the
ops table) and its counter in --stats-json, with no line of the core
naming it. Unregistered, pyvmm knows nothing of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from testkit import helpers

pytestmark = [pytest.mark.kvm]


# Asks twice (14 -> 43, 100 -> 301: the IO thread's answer is 3v+1), then a
# handle that is no test device (EINVAL), then SUCCESS.
PROBE_C = r"""
#include "rt.h"
#include "hypercall.h"

GUEST_MANIFEST({ .name = "probe", .type = MFT_DEV_PYVMM_TEST });

static int ask(uint64_t handle, uint64_t value, uint64_t *answer)
{
    volatile struct hvt_hc_pyvmm_test arg = { .handle = handle, .value = value };
    hvt_hypercall(HVT_HYPERCALL_PYVMM_TEST, &arg);
    *answer = arg.answer;
    return arg.ret;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    uint64_t answer;
    if (ask(1, 14, &answer) != HVT_RET_OK || answer != 43 ||
        ask(1, 100, &answer) != HVT_RET_OK || answer != 301) {
        rt_puts("FAILURE: answer\n");
        return SOLO5_EXIT_FAILURE;
    }
    if (ask(7, 1, &answer) != HVT_RET_EINVAL) {
        rt_puts("FAILURE: unknown handle answered\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
"""

# The pyvmm command in a process of its own, the test kind registered first
# (only code can register a kind: no option or variable loads one).
RUN = """
import sys
from testkit.devkind import registered
with registered():
    from pyvmm.command.cli import main
    status = main(sys.argv[1:])
sys.exit(status)
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return helpers.build_runtime_guest(PROBE_C, tmp_path_factory.mktemp("probe"), "probe")


def pyvmm(*args: str, registered: bool = True) -> subprocess.CompletedProcess:
    code = RUN if registered else "import sys\nfrom pyvmm.command.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_test_kind_answers_its_hypercall_through_its_io_service(probe, tmp_path):
    stats = tmp_path / "stats.json"
    result = pyvmm("--mem=8", f"--stats-json={stats}", "--pyvmm-test:probe=one", str(probe))
    assert result.returncode == 0, result.stderr
    assert "SUCCESS" in result.stdout
    assert "Traceback" not in result.stderr
    snapshot = json.loads(stats.read_text().splitlines()[-1])
    service = snapshot["pyvmm_test"]
    assert service["answered"] == 2  # counted by the IO thread, in C
    assert service["thread"]["wakeups"] >= 2  # each request woke it (event mode)
    assert snapshot["devices"]["probe"]["answered"] == 2


def test_its_option_shows_in_help_only_while_registered():
    assert "--pyvmm-test:NAME=LABEL" in pyvmm("--help").stdout
    assert "--pyvmm-test" not in pyvmm("--help", registered=False).stdout


def test_unregistered_its_option_and_its_device_are_refused_in_one_line(probe):
    result = pyvmm("--pyvmm-test:probe=one", str(probe), registered=False)
    assert result.returncode == 1
    assert result.stderr.startswith("pyvmm: Invalid option: `--pyvmm-test:probe=one'")
    result = pyvmm("--mem=8", str(probe), registered=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"pyvmm: Device 'probe' of type PYVMM_TEST declared but not attached. All declared "
        f"devices must be attached ({probe}: --pyvmm-test:probe=...)"
    ]


def test_a_registered_kind_is_removed_again():
    from pyvmm.devices import kinds
    from testkit.devkind import PROBE, registered

    with registered():
        assert PROBE in kinds()
    assert PROBE not in kinds()

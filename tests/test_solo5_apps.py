"""scripts/solo5_build.py's Solo5-API programs (bench/solo5/): one object
from Solo5's compiler, linked with pyvmm's bindings, Solo5's hvt bindings
and Solo5's spt bindings, each carrying what its form needs; reused while
nothing changed. bench/pps.py --solo5 and bench/soak.py run them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pyvmm.loader.elf import parse_elf
from pyvmm.loader.notes import read_capabilities
from scripts import solo5_build


@pytest.fixture(scope="module")
def solo5() -> solo5_build.Solo5Build:
    try:
        return solo5_build.ensure(log=lambda message: None)
    except solo5_build.BuildError as err:
        pytest.fail(f"Solo5 from the release archive: {err}")


def query_abi(solo5: solo5_build.Solo5Build, path) -> str:
    done = subprocess.run(
        [str(solo5.elftool), "query-abi", str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)["target"]


def test_udpsink_is_linked_in_each_form(solo5) -> None:
    forms = {form: solo5.app("udpsink", form) for form in solo5_build.APP_FORMS}
    assert {form: path.name for form, path in forms.items()} == {
        "pyvmm": "udpsink-pyvmm.hvt",
        "hvt": "udpsink-solo5.hvt",
        "spt": "udpsink-solo5.spt",
    }
    assert {form: query_abi(solo5, path) for form, path in forms.items()} == {
        "pyvmm": "hvt",
        "hvt": "hvt",
        "spt": "spt",
    }
    # pyvmm's runtime says it is one (user mode, shmstream); Solo5's bindings do not.
    relinked = read_capabilities(parse_elf(forms["pyvmm"].read_bytes(), "relinked"))
    assert relinked.shmstream and relinked.user_mode
    assert read_capabilities(parse_elf(forms["hvt"].read_bytes(), "unmodified")).flags == 0


def test_the_programs_are_reused_and_printed(solo5) -> None:
    assert solo5_build.ensure(log=lambda message: None).apps == solo5.apps
    for form in solo5_build.APP_FORMS:
        done = subprocess.run(
            [sys.executable, "scripts/solo5_build.py", "--print", f"udpsink-{form}"],
            capture_output=True,
            text=True,
            cwd=solo5_build.ROOT,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{solo5.app('udpsink', form)}\n"

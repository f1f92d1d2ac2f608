"""The device seam: the plan, the runner, the hypercall table and the fast
path's configuration iterate over the device kinds and name none; each
kind reserves its area at the top of guest memory below the previous
one's, and says why under -v."""

from __future__ import annotations

import io
import logging
import re
import tokenize
from pathlib import Path

import pytest

from conftest import guest
from pyvmm.command.cli import parse_command
from pyvmm.common.errors import UsageError
from pyvmm.common.log import log
from pyvmm.devices import BaseKind, Option, register
from pyvmm.loader import DeviceType, load_kernel
from pyvmm.vm.plan import make_plan

PYVMM = Path(__file__).resolve().parents[2] / "pyvmm"
MIB = 1 << 20

CORE = ("vm/plan.py", "vm/vmm.py", "hvt/hypercalls.py", "hvt/fastpath.py", "vm/config.py")
# What naming a kind looks like in code: its type, its services, its devices.
KIND_WORDS = re.compile(
    r"DeviceType \. (NET|BLOCK)|ShmStream|ShmLayout|Solo5Ring|RING_AREA|\bnets\b|\bdisks\b"
    r"|devices \. (net|block)\b|shm_|solo5_ring|no_net_ring|hybrid_budget"
)


@pytest.mark.parametrize("module", CORE)
def test_the_core_names_no_device_kind(module):
    """In its code, that is: comments and strings (a trace mark's words) aside."""
    source = (PYVMM / module).read_text()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    code = " ".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.STRING))
    assert [m.group(0) for m in KIND_WORDS.finditer(code)] == []


class _Reserving(BaseKind):
    """A kind with no devices that reserves 4 MiB below whatever is above."""

    label = "reserving"
    type = DeviceType.PYVMM_TEST
    options = (Option("reserving", "X", "tests only", attaches=True),)

    class _Plan:
        def __init__(self, bottom: int) -> None:
            self.bottom = bottom

        def explain(self) -> list[str]:
            return [f"reserving: 4 MiB at {self.bottom:#x}"]

    def plan(self, config, kernel, requests, top):
        return self._Plan(top - 4 * MIB)


def _plan(*argv: str):
    config = parse_command([*argv]).config
    return make_plan(config, machine="x86_64", flavour="kvm", load=load_kernel)


def test_each_kind_reserves_below_the_previous_one(caplog):
    remove = register(_Reserving())
    try:
        with caplog.at_level(logging.INFO, logger=log.name):
            plan = _plan("--mem=64", "--net=tap0", str(guest("ping")))
    finally:
        remove()
    net = next(p for k, p in plan.kinds if k.label == "net")
    reserving = next(p for k, p in plan.kinds if k.label == "reserving")
    assert net.shm_layout.gpa + net.shm_layout.size == 64 * MIB  # the net kind first, at the top
    assert reserving.bottom == net.bottom - 4 * MIB
    assert plan.usable == reserving.bottom
    lines = [r.getMessage() for r in caplog.records]
    net_line = next(i for i, line in enumerate(lines) if line.startswith("net: shmstream region"))
    assert lines[net_line + 1] == f"reserving: 4 MiB at {reserving.bottom:#x}"


def test_a_kind_option_is_checked_by_its_kind_even_without_devices():
    with pytest.raises(UsageError, match="--shm=poll: nothing to serve: .* has no net device"):
        _plan("--shm=poll", str(guest("hello")))


def test_a_kind_whose_devices_cannot_be_saved_refuses_a_snapshot(monkeypatch):
    """Any kind may say so (the net kind's state is saved: a stand-in reason)."""
    from pyvmm.devices.net import NET

    monkeypatch.setattr(NET, "not_snapshotted", "its state is not saved")
    with pytest.raises(UsageError, match="a guest with net devices cannot be snapshotted"):
        _plan(
            "--snapshot-at=first-wait", "--snapshot-dir=/nonexistent", "--net=t", str(guest("ping"))
        )

"""The deprivileged emulator against KVM: every instruction form pyvmm
emulates, executed by KVM itself at --cpl=0 in the same guest (on a PVM
host, KVM's own instruction emulator) and trapped and emulated by pyvmm at
--cpl=deprivileged, must leave the same record (docs/testing.md, "The
emulator oracle").

guests/emuoracle.c prints one line per case: the registers the case
changed, the stack pointer's change, the flags, and every exception that
reached the guest's own handlers with its frame and the stack it ran on
(its `ud2` probes show the interrupt flag the guest believes it has, and
which IDT and TSS were used). Where the two runs may differ, the reason is
written here, and the difference must still be there, so the list stays
true.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import guest, run_pyvmm
from pyvmm.arch.x86_64 import decode
from pyvmm.arch.x86_64.traps import TrapEmulator
from testkit.helpers import STATS, parse_stats

pytestmark = pytest.mark.kvm

#: Fields that differ between the levels, by case, and why: state the
#: emulator does not own, read by instructions that do not trap.
DIFFERENCES = {
    ("pushf_after_cli", "rdx"): (
        "pushf does not trap: it shows the CPU's IF (always 1 at CPL 3 under kvm_pvm), "
        "the guest's own IF is the shadow a trap frame shows"
    ),
    ("mov_ds_reg", "rcx"): "mov from DS does not trap: kvm_pvm shows 0 at CPL 3, not 0x10",
    ("mov_es_mem", "rcx"): "mov from ES does not trap: kvm_pvm shows 0 at CPL 3, not 0x10",
    ("mov_ds_opsize", "rcx"): "mov from DS does not trap: kvm_pvm shows 0 at CPL 3, not 0x10",
    **{
        ("mov_ss_rpl3", key): (
            "a load of SS with RPL 3 does not trap (CPL 3 may), so level 0's #GP(selector) "
            "cannot happen deprivileged"
        )
        for key in ("rax", "rsp", "t1")
    },
}

#: Cases whose level-0 record is KVM's, not the architecture's.
KVM_DIFFERS = {
    "iretl": (
        "kvm_pvm raises #GP(0) for iret with 32-bit operand size in 64-bit mode, which the "
        "architecture allows (IRETD pops EIP, CS, EFLAGS, ESP, SS)"
    ),
}

#: Cases KVM cannot execute at level 0 here (an internal error exit), each
#: run alone; checked deprivileged against what the architecture says:
#: (vector, offset of the return address in the case's body, IF inside the
#: handler as its probe saw it, or None without a probe).
KVM_CANNOT = {
    "int3": (3, 1, None),
    "int_interrupt_gate": (0x21, 3, False),  # sti; int $0x21: IF off inside
    "int_trap_gate": (0x22, 3, True),  # a trap gate keeps IF
    "int_n_other_vector": (0x2F, 2, None),
}

#: Each emulator handler (traps.py's _do_NAME, by the decoder's name) and
#: the cases that execute it. A new handler without a row fails
#: test_every_handler_has_a_case.
HANDLER_CASES = {
    "cli": ("cli", "cli_twice", "pushf_after_cli"),
    "sti": ("sti",),
    "hlt": ("hlt",),
    "lgdt": ("lgdt_base", "lgdt_rip", "lgdt_sib", "lgdt_rsp", "lgdt_addr32", "lgdt_fs"),
    "lidt": ("lidt_base", "lidt_rip", "lidt_sib", "lidt_rsp", "lidt_gs", "lidt_rexw"),
    "ltr": ("ltr_reg", "ltr_mem", "ltr_r9", "ltr_busy"),
    "mov_to_sreg": ("mov_ss_reg", "mov_ss_rsp_mem", "mov_ss_fs_mem", "mov_ss_rpl1"),
    "retf": ("lretq", "lretl", "lretq_high_selector_bits"),
    "retf_imm": ("lretq_imm", "lretl_imm"),
    "iret": (
        "iretq_if_on",
        "iretq_if_off",
        "iretq_other_stack",
        "iretq_cs_rpl3",
        "iretq_ss_rpl3",
        "iretl",
    ),
    "mov_from_cr": ("mov_from_cr0", "mov_from_cr3_r9", "mov_from_cr8", "mov_from_cr3_rsp"),
    "wrmsr": ("wrmsr_fs_base", "wrmsr_gs_base_high", "wrmsr_kernel_gs_noncanonical_high"),
    "rdmsr": ("rdmsr_fs_base", "wrmsr_kernel_gs_base"),
    "swapgs": ("swapgs",),
    "invlpg": ("invlpg_base", "invlpg_sib", "invlpg_rip"),
    "wbinvd": ("wbinvd",),
    "invd": ("invd",),
    "int": ("int_interrupt_gate", "int_trap_gate", "int_n_other_vector"),
    "int3": ("int3",),
}

#: Handlers a run's trap counters cannot show, and why.
NOT_COUNTED = {
    "int3": "kvm_pvm raises #BP for int3 at CPL 3 itself (not #GP), so it is delivered "
    "as an exception; the handler is for a CPU that raises #GP",
}

OWN_RUNS = (*KVM_CANNOT, "hlt", "idt_limit", "iretq_to_outer_level")


def records(stdout: str) -> dict[str, dict[str, str]]:
    """``case NAME: k=v ...`` lines by name; exceptions as t1, t2, ..."""
    found: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"case (\w+): (.*)", line)
        if match is None:
            continue
        fields: dict[str, str] = {}
        traps = 0
        for item in match.group(2).split():
            key, _, value = item.partition("=")
            if key == "t":
                traps += 1
                key = f"t{traps}"
            fields[key] = value
        assert match.group(1) not in found, line
        found[match.group(1)] = fields
    return found


def trap(fields: dict[str, str], n: int = 1) -> dict[str, int | str]:
    """Exception ``n`` of a case: vector (decimal), the frame (hex), its stack."""
    vector, *frame, stack = fields[f"t{n}"].split("/")[:8]
    names = ("error", "rip", "cs", "rflags", "rsp", "ss")
    found: dict[str, int | str] = dict(zip(names, (int(v, 16) for v in frame), strict=True))
    found.update(vector=int(vector), stack=stack)
    return found


def run(mode: str, *args: str) -> subprocess.CompletedProcess:
    return run_pyvmm(STATS, f"--cpl={mode}", guest("emuoracle"), *args, timeout=300)


@pytest.fixture(scope="module")
def both() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return run("0"), run("deprivileged")


def test_every_case_is_what_kvm_does_at_cpl0(both):
    at0, dep = both
    for result in both:
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[-1] == "SUCCESS"
    assert parse_stats(at0.stderr)["privilege"] == "kernel"
    assert parse_stats(dep.stderr)["privilege"] == "deprivileged"
    kvm, ours = records(at0.stdout), records(dep.stdout)
    assert list(ours) == list(kvm) and len(kvm) > 60
    wrong = []
    for name, fields in kvm.items():
        if name in KVM_DIFFERS:
            continue
        for key in sorted(set(fields) | set(ours[name])):
            if (name, key) in DIFFERENCES:
                continue
            if fields.get(key) != ours[name].get(key):
                wrong.append(
                    f"{name}: {key} at CPL 0 {fields.get(key)}, deprivileged {ours[name].get(key)}"
                )
    assert not wrong, "\n".join(wrong)


def test_the_documented_differences_are_still_there(both):
    kvm, ours = (records(result.stdout) for result in both)
    for name, key in DIFFERENCES:
        assert kvm[name].get(key) != ours[name].get(key), (name, key, DIFFERENCES[name, key])


def test_iretl_where_kvm_is_not_the_reference(both):
    kvm, ours = (records(result.stdout)["iretl"] for result in both)
    # KVM: a #GP(0) at the iretl itself (the case ends there).
    assert (trap(kvm)["vector"], trap(kvm)["error"]) == (13, 0) and kvm["rsp"] == "-8"
    # pyvmm: the return happened; the probe after it sees the popped flags
    # (CF PF AF ZF SF and IF) on the stack the dwords named.
    probe = trap(ours)
    assert "rsp" not in ours and probe["vector"] == 6
    assert probe["rflags"] & 0x2D7 == 0x2D7 and int(ours["fl"], 16) & 0xD7 == 0xD7
    assert probe["rip"] == trap(kvm)["rip"] + 1  # right after the one-byte iretl


def symbol(name: str) -> int:
    out = subprocess.run(
        ["nm", str(guest("emuoracle"))], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(rf"^([0-9a-f]+) \w {name}$", out, re.M).group(1), 16)


@pytest.mark.parametrize("name", sorted(KVM_CANNOT))
def test_what_kvm_cannot_execute_at_cpl0(name):
    at0 = run("0", name)
    assert at0.returncode == 1
    assert "KVM: internal error exit" in at0.stderr, at0.stderr
    assert f"at body_{name}" in at0.stderr
    dep = run("deprivileged", name)
    assert dep.returncode == 0, dep.stdout + dep.stderr
    vector, offset, inside_if = KVM_CANNOT[name]
    fields = records(dep.stdout)[name]
    frame = trap(fields)
    assert (frame["vector"], frame["error"], frame["cs"], frame["ss"]) == (vector, 0, 8, 0x10)
    assert frame["rip"] == symbol(f"body_{name}") + offset
    assert "rsp" not in fields  # the handler returned to the case
    if inside_if is not None:
        assert bool(frame["rflags"] & 0x200)  # sti before the int
        assert bool(trap(fields, 2)["rflags"] & 0x200) == inside_if


def test_hlt_ends_the_run_in_the_same_line():
    at0, dep = run("0", "hlt"), run("deprivileged", "hlt")
    assert at0.returncode == dep.returncode == 1
    line = [x for x in at0.stderr.splitlines() if x.startswith("pyvmm:")]
    assert line == [x for x in dep.stderr.splitlines() if x.startswith("pyvmm:")]
    assert re.fullmatch(
        r"pyvmm: guest halted the CPU without the halt hypercall "
        r"\(rip=0x[0-9a-f]+ rsp=0x[0-9a-f]+ cr2=0x0\) at body_hlt\+0x1",
        line[0],
    )


def test_an_exception_past_the_idt_limit_ends_the_run_where_level_0_does():
    """No gate for #UD (the IDT's limit ends before it): a triple fault at
    both levels, at the same rip and rsp. The cause differs by design: a
    level-0 shutdown exit carries no vector, so its line guesses from CR2
    (here 0, so "page zero"); deprivileged, pyvmm knows it was #UD."""
    at0, dep = run("0", "idt_limit"), run("deprivileged", "idt_limit")
    assert at0.returncode == dep.returncode == 1
    where = re.compile(
        r"^pyvmm: guest fault: .* (\(rip=\S+ rsp=\S+ cr2=0x0\) at body_idt_limit\S+)$", re.M
    )
    ends = [where.search(result.stderr) for result in (at0, dep)]
    assert None not in ends, (at0.stderr, dep.stderr)
    assert ends[0].group(1) == ends[1].group(1)
    assert "triple fault (unhandled exception #UD)" in dep.stderr


def test_a_return_to_an_outer_level_is_refused_in_one_line():
    """An iretq to the guest's own DPL 3 code descriptor would enter user
    mode, which pyvmm does not emulate (the guest runs at one level). Not
    run at level 0: KVM returns to CPL 3 and the guest, whose pages are
    supervisor-only there, never gets back."""
    dep = run("deprivileged", "iretq_to_outer_level")
    assert dep.returncode == 1
    lines = [line for line in dep.stderr.splitlines() if line.startswith("pyvmm:")]
    assert len(lines) == 1 and re.fullmatch(
        r"pyvmm: guest fault: privileged instruction pyvmm does not emulate "
        r"\(a return to CPL 3\): bytes 48 cf at rip=0x[0-9a-f]+ "
        r"at body_iretq_to_outer_level\+0x[0-9a-f]+; run it with --cpl=0",
        lines[0],
    ), dep.stderr


def handlers() -> set[str]:
    """Every name the decoder's tables give that the emulator answers."""
    names: set[str] = set()
    for op in (*decode.ONE_BYTE.values(), *decode.TWO_BYTE.values()):
        names.update(op.name.values() if isinstance(op.name, dict) else [op.name])
        names.update((op.register_only or {}).values())
    return {name for name in names if hasattr(TrapEmulator, f"_do_{name}")}


def test_every_handler_has_a_case(both):
    found = handlers()
    assert found >= {"lgdt", "iret", "wrmsr", "cli"}  # the reading above works
    missing = found - set(HANDLER_CASES)
    assert not missing, f"emulator handlers with no oracle case: {sorted(missing)}"
    assert set(HANDLER_CASES) <= found, "a row for a handler that is gone"
    names = set(records(both[1].stdout)) | set(OWN_RUNS)
    for handler, cases in HANDLER_CASES.items():
        assert set(cases) <= names, (handler, set(cases) - names)


def test_every_handler_was_trapped_into(both):
    """The cases reach the handlers: a case that runs natively at CPL 3
    (a DS load with a DPL 3 selector) would test nothing."""
    counted = dict(parse_stats(both[1].stderr)["traps"])
    for name in OWN_RUNS:
        for key, count in parse_stats(run("deprivileged", name).stderr)["traps"].items():
            counted[key] = counted.get(key, 0) + count
    never = {name for name in HANDLER_CASES if not counted.get(name)} - set(NOT_COUNTED)
    assert not never, f"handlers no case trapped into: {sorted(never)} ({counted})"
    assert counted.get("deliver #BP")  # int3, delivered as the exception it raised

#!/usr/bin/env python3
"""What KVM here gives a debugger, by privilege mode (docs/debugging.md).

    scripts/kvm_debug_probe.py [KERNEL]

For each mode pyvmm runs a guest in (0, user mode at 3, deprivileged), sets
up the guest as a run would, then asks KVM_SET_GUEST_DEBUG for a single
step and, separately, for a hardware execution breakpoint (DR0) at the
instruction the single step reached, runs the vCPU and prints the exits:
a KVM_EXIT_DEBUG (``Debug(...)`` from pyvmm's decoder) is what a
GDB stub needs; anything else means the debug exception went to the guest
(a shutdown at level 3 with no IDT, or pyvmm's trap stub's port in
deprivileged mode: 0xc1 for #DB, 0xc3 for #BP).
"""

from __future__ import annotations

import fcntl
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyvmm.arch.x86_64.cpu import get_regs  # noqa: E402
from pyvmm.vm.config import VmConfig  # noqa: E402
from pyvmm.vm.vmm import Vmm  # noqa: E402

KVM_SET_GUEST_DEBUG = 0x4048AE9B  # _IOW(KVMIO, 0x9b, struct kvm_guest_debug), x86_64
KVM_CAP_SET_GUEST_DEBUG = 23
ENABLE, SINGLESTEP, USE_HW_BP = 0x1, 0x2, 0x20000


def exits(kernel: str, cpl: str, control: int, dr0: int = 0, runs: int = 3) -> list[str]:
    with Vmm(VmConfig(kernel, cpl=cpl)) as vmm:
        if not vmm.system.check_extension(KVM_CAP_SET_GUEST_DEBUG):
            return ["no KVM_CAP_SET_GUEST_DEBUG"]
        debugregs = [dr0, 0, 0, 0, 0, 0, 0, 0x1 if dr0 else 0]  # DR7.L0, execute
        try:
            fcntl.ioctl(
                vmm.vcpu.fd, KVM_SET_GUEST_DEBUG, struct.pack("<II8Q", control, 0, *debugregs)
            )
        except OSError as err:
            return [f"KVM_SET_GUEST_DEBUG refused: {err.strerror}"]
        out = []
        for _ in range(runs):
            exit = vmm.vcpu.run(None)
            out.append(f"{exit} rip={get_regs(vmm.vcpu).rip:#x}")
        return out


def main() -> int:
    kernel = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "guests/bin/hello.hvt")
    for cpl in ("0", "3", "deprivileged"):
        steps = exits(kernel, cpl, ENABLE | SINGLESTEP)
        print(f"--cpl={cpl}: single step: {'; '.join(steps)}")
        # The hardware breakpoint at the third instruction level 0 stepped to.
        target = int(exits(kernel, "0", ENABLE | SINGLESTEP)[1].rsplit("rip=", 1)[1], 16)
        hits = exits(kernel, cpl, ENABLE | USE_HW_BP, dr0=target, runs=2)
        print(f"--cpl={cpl}: hardware breakpoint at {target:#x}: {'; '.join(hits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

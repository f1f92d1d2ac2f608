/*
 * The arm64 KVM register ids and struct facts pyvmm uses, computed by the
 * kernel headers' own macros: tests/aarch64/test_aarch64_kvm.py compares
 * them with pyvmm.arch.aarch64.regs.table() (which reads offsets through
 * cffi). Built static by scripts/test-aarch64 with aarch64-linux-gnu-gcc.
 */
#include <stddef.h>
#include <stdio.h>
#include <linux/kvm.h>

#define CORE(name, field) \
    printf("%s %llu\n", name, (unsigned long long)(KVM_REG_ARM64 | KVM_REG_SIZE_U64 | \
           KVM_REG_ARM_CORE | KVM_REG_ARM_CORE_REG(field)))
#define SYS(name, ...) \
    printf("%s %llu\n", name, (unsigned long long)ARM64_SYS_REG(__VA_ARGS__))

int main(void)
{
    char name[8];

    for (int n = 0; n < 31; n++) {
        snprintf(name, sizeof(name), "x%d", n);
        printf("%s %llu\n", name, (unsigned long long)(KVM_REG_ARM64 | KVM_REG_SIZE_U64 |
               KVM_REG_ARM_CORE | (KVM_REG_ARM_CORE_REG(regs.regs[0]) + 2 * n)));
    }
    CORE("sp", regs.sp);
    CORE("pc", regs.pc);
    CORE("pstate", regs.pstate);
    CORE("sp_el1", sp_el1);
    CORE("elr_el1", elr_el1);
    CORE("spsr_el1", spsr[KVM_SPSR_EL1]);
    SYS("sctlr_el1", 3, 0, 1, 0, 0);
    SYS("cpacr_el1", 3, 0, 1, 0, 2);
    SYS("ttbr0_el1", 3, 0, 2, 0, 0);
    SYS("ttbr1_el1", 3, 0, 2, 0, 1);
    SYS("tcr_el1", 3, 0, 2, 0, 2);
    SYS("esr_el1", 3, 0, 5, 2, 0);
    SYS("far_el1", 3, 0, 6, 0, 0);
    SYS("mair_el1", 3, 0, 10, 2, 0);
    SYS("vbar_el1", 3, 0, 12, 0, 0);
    SYS("tpidr_el1", 3, 0, 13, 0, 4);
    for (int n = 0; n < 32; n++) {
        snprintf(name, sizeof(name), "v%d", n);
        printf("%s %llu\n", name, (unsigned long long)(KVM_REG_ARM64 | KVM_REG_SIZE_U128 |
               KVM_REG_ARM_CORE | KVM_REG_ARM_CORE_REG(fp_regs.vregs[n])));
    }
    printf("fpsr %llu\n", (unsigned long long)(KVM_REG_ARM64 | KVM_REG_SIZE_U32 |
           KVM_REG_ARM_CORE | KVM_REG_ARM_CORE_REG(fp_regs.fpsr)));
    printf("fpcr %llu\n", (unsigned long long)(KVM_REG_ARM64 | KVM_REG_SIZE_U32 |
           KVM_REG_ARM_CORE | KVM_REG_ARM_CORE_REG(fp_regs.fpcr)));
    printf("KVM_SET_GUEST_DEBUG %lu\n", (unsigned long)KVM_SET_GUEST_DEBUG);
    printf("KVM_GUESTDBG_USE_SW_BP %lu\n", (unsigned long)KVM_GUESTDBG_USE_SW_BP);
    printf("KVM_GUESTDBG_USE_HW %lu\n", (unsigned long)KVM_GUESTDBG_USE_HW);
    printf("KVM_CAP_GUEST_DEBUG_HW_BPS %lu\n", (unsigned long)KVM_CAP_GUEST_DEBUG_HW_BPS);
    printf("KVM_CAP_GUEST_DEBUG_HW_WPS %lu\n", (unsigned long)KVM_CAP_GUEST_DEBUG_HW_WPS);
    printf("sizeof_kvm_regs %zu\n", sizeof(struct kvm_regs));
    printf("offsetof_fp_regs %zu\n", offsetof(struct kvm_regs, fp_regs));
    printf("sizeof_kvm_vcpu_init %zu\n", sizeof(struct kvm_vcpu_init));
    printf("KVM_ARM_VCPU_INIT %lu\n", (unsigned long)KVM_ARM_VCPU_INIT);
    printf("KVM_ARM_PREFERRED_TARGET %lu\n", (unsigned long)KVM_ARM_PREFERRED_TARGET);
    printf("KVM_SET_ONE_REG %lu\n", (unsigned long)KVM_SET_ONE_REG);
    return 0;
}

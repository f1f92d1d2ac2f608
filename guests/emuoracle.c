/*
 * emuoracle: every instruction form pyvmm's deprivileged emulator handles
 * (pyvmm/arch/x86_64/traps.py), each executed once in a case and what it
 * left behind printed in one line, so that a run at --cpl=0 (where KVM
 * executes it) and a run at --cpl=deprivileged (where it traps and pyvmm
 * emulates it) can be compared line by line (tests/test_emulator_oracle.py,
 * docs/testing.md).
 *
 * A case is a small assembly body called by run_case with every general
 * register set to a pattern and the arithmetic flags set.  After it the
 * line says which registers changed (name=value), the stack pointer's
 * change (rsp=+N), the flags (fl=, IF left out: pushf cannot show the
 * interrupt flag deprivileged) and each exception that reached the guest's
 * own handlers (t=vector/error code/rip/cs/rflags/rsp/ss/stack it ran on).
 * A `ud2` in a body is a probe: its #UD frame shows the interrupt flag the
 * guest believes it has and which IDT and TSS the CPU used; the handler
 * goes on after it.  Any other fault ends the case (the line shows it).
 *
 *   emuoracle.hvt          the start-up sequence (as Solo5's), then every
 *                          case: "case NAME: ..." lines and "SUCCESS"
 *   emuoracle.hvt CASE     only that case, for int3 and int n (which KVM
 *                          cannot execute at CPL 0 here: an internal error
 *                          exit), hlt (the run ends: no halt hypercall),
 *                          idt_limit and iretq_to_outer_level (the run ends)
 *
 * Like an unmodified Solo5 unikernel it carries no pyvmm capability note.
 */
#include "rt.h"

GUEST_MANIFEST();

#define MSR_FS_BASE 0xc0000100u
#define MSR_GS_BASE 0xc0000101u
#define MSR_KERNEL_GS_BASE 0xc0000102u

#define NTSS 24        /* one per ltr: a real ltr marks its TSS busy */
#define IST_SIZE 1024
#define GATES 48
#define GDT_WORDS 12   /* null, code, data, four 64-bit TSS descriptors */
#define NGDT 20        /* copies for the lgdt cases, one TSS each */

struct __attribute__((packed)) table_ptr {
    uint16_t limit;
    uint64_t base;
};

struct __attribute__((packed)) tss {
    uint32_t reserved0;
    uint64_t rsp[3];
    uint64_t reserved1;
    uint64_t ist[7];
    uint64_t reserved2;
    uint16_t reserved3;
    uint16_t iomap_base;
};

struct gate {
    uint16_t offset_lo;
    uint16_t selector;
    uint8_t ist;
    uint8_t type_attr;
    uint16_t offset_mid;
    uint32_t offset_hi;
    uint32_t reserved;
};

struct trap_frame {
    uint64_t vector;
    uint64_t error_code;
    uint64_t rip, cs, rflags, rsp, ss;
};

/* The two IDTs the lidt cases alternate between: #UD on IST1 in A, on the
 * current stack in B. */
static struct gate idt_a[GATES] __attribute__((aligned(16)));
static struct gate idt_b[GATES] __attribute__((aligned(16)));
static uint64_t gdt[GDT_WORDS] __attribute__((aligned(16)));
static uint64_t gdts[NGDT][GDT_WORDS] __attribute__((aligned(16)));
static struct tss tss[NTSS] __attribute__((aligned(16)));
static uint8_t ist_stack[NTSS][IST_SIZE] __attribute__((aligned(16)));

/* Operands the bodies name (by symbol, RIP-relative or absolute). */
struct table_ptr gdtrs[NGDT + 1];
struct table_ptr idtrs[2];
uint16_t selector_word[4] = { 0x10, 0x28, 0x38, 0x48 };
uint64_t probe_block[4] = { 0x0b10c0000000f500ULL, 0x0b10c0000000f508ULL,
                            0x0b10c0000000f510ULL, 0x0b10c0000000f518ULL };
uint64_t alt_stack[64] __attribute__((aligned(16)));
const uint64_t read_only_word = 0x5ead0000000000aaULL;

/* The harness (below): the registers a case starts with and ends with. */
uint64_t case_in[16], case_out[16], case_flags, saved_rsp;
void (*case_body)(void);
uint64_t resume_at;   /* where the handler resumes a fault, when set */
extern char case_after[];
extern char trap_entries[];
void run_case(void);

/* What the guest's handlers saw during one case. */
#define MAX_TRAPS 3
struct seen {
    uint64_t vector, error, rip, cs, rflags, rsp, ss, cr2;
    char stack[16];
};
static struct seen seen[MAX_TRAPS];
static int seen_count;

static const char *const GPR[16] = {
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
    "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
};

__asm__(
    ".text\n"
    /* Trap entries: a dummy error code where the CPU pushes none, the
     * vector, then the common path that saves the caller-saved registers
     * and calls trap_handler(frame). */
    ".balign 16\n"
    "trap_entries:\n"
    ".altmacro\n"
    ".macro entry n\n"
    "  .balign 16\n"
    "  .if (\\n == 8) || (\\n >= 10 && \\n <= 14) || (\\n == 17) || (\\n == 21)\n"
    "  .else\n"
    "    pushq $0\n"
    "  .endif\n"
    "  pushq $\\n\n"
    "  jmp trap_common\n"
    ".endm\n"
    ".set i, 0\n"
    ".rept 48\n"
    "  entry %i\n"
    "  .set i, i + 1\n"
    ".endr\n"
    "trap_common:\n"
    "  cld\n"
    "  pushq %rax; pushq %rcx; pushq %rdx; pushq %rsi; pushq %rdi\n"
    "  pushq %r8; pushq %r9; pushq %r10; pushq %r11; pushq %rbx\n"
    "  leaq 80(%rsp), %rdi\n"
    "  movq %rsp, %rbx\n"
    "  andq $-16, %rsp\n"
    "  call trap_handler\n"
    "  movq %rbx, %rsp\n"
    "  popq %rbx; popq %r11; popq %r10; popq %r9; popq %r8\n"
    "  popq %rdi; popq %rsi; popq %rdx; popq %rcx; popq %rax\n"
    "  addq $16, %rsp\n"
    "  iretq\n"

    /* run_case: call case_body with every register but rsp from case_in
     * and CF, PF, AF, ZF, SF and OF set; store them into case_out and the
     * flags into case_flags. */
    ".globl run_case\n"
    "run_case:\n"
    "  pushq %rbx; pushq %rbp; pushq %r12; pushq %r13; pushq %r14; pushq %r15\n"
    "  movq %rsp, saved_rsp(%rip)\n"
    "  pushfq\n"
    "  andq $~0xcd5, (%rsp)\n"
    "  orq $0x8d5, (%rsp)\n"
    "  popfq\n"
    "  movq case_in+0(%rip), %rax\n"
    "  movq case_in+8(%rip), %rcx\n"
    "  movq case_in+16(%rip), %rdx\n"
    "  movq case_in+24(%rip), %rbx\n"
    "  movq case_in+40(%rip), %rbp\n"
    "  movq case_in+48(%rip), %rsi\n"
    "  movq case_in+56(%rip), %rdi\n"
    "  movq case_in+64(%rip), %r8\n"
    "  movq case_in+72(%rip), %r9\n"
    "  movq case_in+80(%rip), %r10\n"
    "  movq case_in+88(%rip), %r11\n"
    "  movq case_in+96(%rip), %r12\n"
    "  movq case_in+104(%rip), %r13\n"
    "  movq case_in+112(%rip), %r14\n"
    "  movq case_in+120(%rip), %r15\n"
    "  call *case_body(%rip)\n"
    ".globl case_after\n"
    "case_after:\n"
    "  movq %rax, case_out+0(%rip)\n"
    "  movq %rcx, case_out+8(%rip)\n"
    "  movq %rdx, case_out+16(%rip)\n"
    "  movq %rbx, case_out+24(%rip)\n"
    "  movq %rsp, case_out+32(%rip)\n"
    "  movq %rbp, case_out+40(%rip)\n"
    "  movq %rsi, case_out+48(%rip)\n"
    "  movq %rdi, case_out+56(%rip)\n"
    "  movq %r8, case_out+64(%rip)\n"
    "  movq %r9, case_out+72(%rip)\n"
    "  movq %r10, case_out+80(%rip)\n"
    "  movq %r11, case_out+88(%rip)\n"
    "  movq %r12, case_out+96(%rip)\n"
    "  movq %r13, case_out+104(%rip)\n"
    "  movq %r14, case_out+112(%rip)\n"
    "  movq %r15, case_out+120(%rip)\n"
    "  pushfq\n"
    "  popq case_flags(%rip)\n"
    "  movq saved_rsp(%rip), %rsp\n"
    "  cld\n"
    "  popq %r15; popq %r14; popq %r13; popq %r12; popq %rbp; popq %rbx\n"
    "  ret\n");

/* Each body: a function run_case calls; ends with ret, stack balanced. */
#define BODY(name, text)                                                    \
    void body_##name(void);                                                 \
    __asm__(".text\n.balign 16\nbody_" #name ":\n" text "\n  ret\n")

/* Small helpers for the bodies' text. */
#define WRMSR(msr, value)                                                   \
    "  movl $" #msr ", %ecx\n  movabsq $" #value ", %rax\n"                 \
    "  movq %rax, %rdx\n  shrq $32, %rdx\n  wrmsr\n"
#define RDMSR(msr) "  movl $" #msr ", %ecx\n  rdmsr\n"
/* lgdt case k: after the load, ltr of its TSS (0x18) and a probe. */
#define LTR_PROBE "  movl $0x18, %eax\n  ltr %ax\n  ud2\n"
#define GDTR(k) "gdtrs+10*" #k
#define BUSY(k) "  movzbl gdts+96*" #k "-96+29(%rip), %esi\n"

/* -- the interrupt flag ------------------------------------------------ */
BODY(cli, "  sti\n  cli\n  ud2\n");
BODY(sti, "  sti\n  ud2\n  cli\n");
BODY(cli_twice, "  cli\n  cli\n  ud2\n");
/* Not trapped: pushf shows the CPU's IF, not the guest's (docs/pvm.md). */
BODY(pushf_after_cli, "  cli\n  pushfq\n  popq %rdx\n");

/* -- lgdt: every addressing form, each seen through the ltr that reads it */
BODY(lgdt_base, "  leaq " GDTR(1) "(%rip), %rbx\n  lgdt (%rbx)\n" LTR_PROBE BUSY(1));
BODY(lgdt_disp8, "  leaq " GDTR(2) "-8(%rip), %rbx\n  lgdt 8(%rbx)\n" LTR_PROBE BUSY(2));
BODY(lgdt_disp32,
     "  leaq " GDTR(3) "-0x1000(%rip), %rbx\n  lgdt 0x1000(%rbx)\n" LTR_PROBE BUSY(3));
BODY(lgdt_rip, "  lgdt " GDTR(4) "(%rip)\n" LTR_PROBE BUSY(4));
BODY(lgdt_sib,
     "  leaq gdtrs(%rip), %rbx\n  movl $25, %ecx\n  lgdt (%rbx,%rcx,2)\n" LTR_PROBE BUSY(5));
BODY(lgdt_sib_nobase, "  movl $2, %ecx\n  lgdt " GDTR(6) "-8(,%rcx,4)\n" LTR_PROBE BUSY(6));
BODY(lgdt_rsp,
     "  subq $16, %rsp\n  movq " GDTR(7) "(%rip), %rax\n  movq %rax, (%rsp)\n"
     "  movw " GDTR(7) "+8(%rip), %ax\n  movw %ax, 8(%rsp)\n"
     "  lgdt (%rsp)\n  addq $16, %rsp\n" LTR_PROBE BUSY(7));
BODY(lgdt_r13, "  leaq " GDTR(8) "(%rip), %r13\n  lgdt (%r13)\n" LTR_PROBE BUSY(8));
BODY(lgdt_r12_index,
     "  leaq " GDTR(9) "-80(%rip), %r12\n  movl $10, %r11d\n  lgdt (%r12,%r11,8)\n"
     LTR_PROBE BUSY(9));
BODY(lgdt_addr32,
     "  leaq " GDTR(10) "(%rip), %rbx\n  movabsq $0xffffffff00000000, %rax\n"
     "  orq %rax, %rbx\n  lgdt (%ebx)\n" LTR_PROBE BUSY(10));
BODY(lgdt_fs,
     WRMSR(0xc0000100, 0x1000)
     "  leaq " GDTR(11) "-0x1000(%rip), %rbx\n  lgdt %fs:(%rbx)\n" LTR_PROBE BUSY(11));
BODY(lgdt_gs,
     WRMSR(0xc0000101, 0x2000)
     "  leaq " GDTR(12) "-0x2000(%rip), %rbx\n  lgdt %gs:(%rbx)\n" LTR_PROBE BUSY(12));
BODY(lgdt_opsize, "  leaq " GDTR(13) "(%rip), %rbx\n  .byte 0x66\n  lgdt (%rbx)\n"
     LTR_PROBE BUSY(13));
BODY(lgdt_rexw, "  leaq " GDTR(14) "(%rip), %rbx\n  .byte 0x48, 0x0f, 0x01, 0x13\n"
     LTR_PROBE BUSY(14));
BODY(lgdt_rip_rexb,
     "  .byte 0x41, 0x0f, 0x01, 0x15\n  .long " GDTR(15) " - (. + 4)\n" LTR_PROBE BUSY(15));
BODY(lgdt_cs_prefix, "  leaq " GDTR(16) "(%rip), %rbx\n  .byte 0x2e\n  lgdt (%rbx)\n"
     LTR_PROBE BUSY(16));
BODY(lgdt_ss_prefix_rsp_disp,
     "  subq $32, %rsp\n  movq " GDTR(17) "(%rip), %rax\n  movq %rax, 8(%rsp)\n"
     "  movw " GDTR(17) "+8(%rip), %ax\n  movw %ax, 16(%rsp)\n"
     "  .byte 0x36\n  lgdt 8(%rsp)\n  addq $32, %rsp\n" LTR_PROBE BUSY(17));
/* A REX prefix counts only right before the opcode (a legacy prefix after
 * it cancels it), and of two the last. */
BODY(lgdt_rex_before_prefix, "  leaq " GDTR(18) "(%rip), %rbx\n  .byte 0x41, 0x66, 0x0f, 0x01, 0x13\n"
     LTR_PROBE BUSY(18));
BODY(lgdt_addr32_sib,
     "  leaq gdtrs(%rip), %rbx\n  movl $95, %ecx\n  movabsq $0x4400000000000000, %rax\n"
     "  orq %rax, %rcx\n  lgdt (%ebx,%ecx,2)\n" LTR_PROBE BUSY(19));
/* Back to the main GDT for what follows. */
BODY(lgdt_main, "  lgdt gdtrs(%rip)\n");

/* -- ltr: register and memory operands, on the main GDT ---------------- */
BODY(ltr_reg, "  movl $0x28, %eax\n  ltr %ax\n  ud2\n  movzbl gdt+45(%rip), %esi\n");
BODY(ltr_mem, "  leaq selector_word+4(%rip), %rbx\n  ltr (%rbx)\n  ud2\n"
     "  movzbl gdt+61(%rip), %esi\n");
BODY(ltr_r9, "  movl $0xffff0048, %r9d\n  ltr %r9w\n  ud2\n  movzbl gdt+77(%rip), %esi\n");
BODY(ltr_busy, "  movl $0x28, %eax\n  ltr %ax\n");

/* -- lidt: alternate A and B, so a load that did nothing shows --------- */
BODY(lidt_base, "  leaq idtrs+10(%rip), %rbx\n  lidt (%rbx)\n  ud2\n");
BODY(lidt_rip, "  lidt idtrs(%rip)\n  ud2\n");
BODY(lidt_sib, "  leaq idtrs(%rip), %rbx\n  movl $5, %ecx\n  lidt (%rbx,%rcx,2)\n  ud2\n");
BODY(lidt_rsp,
     "  subq $16, %rsp\n  movq idtrs(%rip), %rax\n  movq %rax, (%rsp)\n"
     "  movw idtrs+8(%rip), %ax\n  movw %ax, 8(%rsp)\n  lidt (%rsp)\n  addq $16, %rsp\n"
     "  ud2\n");
BODY(lidt_gs, WRMSR(0xc0000101, 0x3000)
     "  leaq idtrs+10-0x3000(%rip), %rdi\n  lidt %gs:(%rdi)\n  ud2\n");
BODY(lidt_addr32, "  leaq idtrs(%rip), %rsi\n  movabsq $0x1234567800000000, %rax\n"
     "  orq %rax, %rsi\n  lidt (%esi)\n  ud2\n");
BODY(lidt_rexw, "  leaq idtrs+10(%rip), %rbx\n  .byte 0x48, 0x0f, 0x01, 0x1b\n  ud2\n");
BODY(lidt_a, "  lidt idtrs(%rip)\n");

/* -- mov to a segment register ----------------------------------------- */
BODY(mov_ds_reg, "  movl $0x10, %eax\n  movl %eax, %ds\n  movl %ds, %ecx\n"
     "  movq probe_block, %rdx\n");
BODY(mov_es_mem, "  leaq selector_word(%rip), %rbx\n  movw (%rbx), %es\n  movl %es, %ecx\n");
BODY(mov_ds_opsize, "  movl $0x10, %eax\n  .byte 0x66, 0x8e, 0xd8\n  movl %ds, %ecx\n");
BODY(mov_ss_reg, "  movl $0x10, %r10d\n  movl %r10d, %ss\n  movq %rsp, %rdx\n");
BODY(mov_ss_rsp_mem, "  pushq $0x10\n  movw (%rsp), %ss\n  popq %rax\n");
/* SS with RPL 1 or 3 at level 0: #GP(selector) (RPL 3 does not trap at CPL 3). */
BODY(mov_ss_rpl1, "  movl $0x11, %eax\n  movl %eax, %ss\n  movl $0x10, %eax\n  movl %eax, %ss\n");
BODY(mov_ss_rpl3, "  movl $0x13, %eax\n  movl %eax, %ss\n  movl $0x10, %eax\n  movl %eax, %ss\n");
BODY(mov_ss_fs_mem, WRMSR(0xc0000100, 0x100)
     "  leaq selector_word-0x100(%rip), %rbx\n  movw %fs:(%rbx), %ss\n");
BODY(mov_fs_base,
     WRMSR(0xc0000100, 0x5000)
     "  movl $0x10, %eax\n  movl %eax, %fs\n" RDMSR(0xc0000100));
BODY(mov_gs_base,
     WRMSR(0xc0000101, 0x6000)
     "  movl $0x10, %eax\n  movl %eax, %gs\n" RDMSR(0xc0000101));

/* -- far returns -------------------------------------------------------- */
BODY(lretq, "  pushq $0x08\n  leaq 1f(%rip), %rax\n  pushq %rax\n  lretq\n1:\n");
BODY(lretq_imm,
     "  subq $16, %rsp\n  pushq $0x08\n  leaq 1f(%rip), %rax\n  pushq %rax\n"
     "  lretq $16\n1:\n");
BODY(lretl,
     "  subq $8, %rsp\n  movl $0x08, 4(%rsp)\n  leaq 1f(%rip), %rax\n"
     "  movl %eax, (%rsp)\n  lretl\n1:\n");
BODY(lretl_imm,
     "  subq $16, %rsp\n  movl $0x08, 4(%rsp)\n  leaq 1f(%rip), %rax\n"
     "  movl %eax, (%rsp)\n  lretl $8\n1:\n");
BODY(lretq_high_selector_bits,
     "  movabsq $0xffffabcd00000008, %rax\n  pushq %rax\n  leaq 1f(%rip), %rax\n"
     "  pushq %rax\n  lretq\n1:\n");

/* -- iret ----------------------------------------------------------------
 * The frame built on the stack, then (for the flags) a probe and pushf. */
#define IRETQ_FRAME(flags)                                                  \
    "  movq %rsp, %rax\n  pushq $0x10\n  pushq %rax\n  pushq $" #flags "\n"  \
    "  pushq $0x08\n  leaq 1f(%rip), %rcx\n  pushq %rcx\n"
BODY(iretq_if_on, IRETQ_FRAME(0x2c3) "  iretq\n1:\n  ud2\n  cli\n");
BODY(iretq_if_off, "  sti\n" IRETQ_FRAME(0x046) "  iretq\n1:\n  ud2\n");
BODY(iretq_other_stack,
     "  movq %rsp, %rbx\n  leaq alt_stack+256(%rip), %rax\n  pushq $0x10\n  pushq %rax\n"
     "  pushq $0x087\n  pushq $0x08\n  leaq 1f(%rip), %rcx\n  pushq %rcx\n  iretq\n"
     "1:\n  movq %rsp, %r14\n  movq %rbx, %rsp\n");
/* CS or SS with RPL 3 (the guest's descriptors are DPL 0): #GP(selector). */
BODY(iretq_cs_rpl3,
     "  movq %rsp, %rax\n  pushq $0x10\n  pushq %rax\n  pushq $2\n  pushq $0x0b\n"
     "  leaq 1f(%rip), %rcx\n  pushq %rcx\n  iretq\n1:\n");
BODY(iretq_ss_rpl3,
     "  movq %rsp, %rax\n  pushq $0x13\n  pushq %rax\n  pushq $2\n  pushq $0x08\n"
     "  leaq 1f(%rip), %rcx\n  pushq %rcx\n  iretq\n1:\n");
BODY(iretq_ac_id,
     IRETQ_FRAME(0x240002) "  iretq\n1:\n  pushfq\n  popq %r13\n  andq $~0x200, %r13\n"
     "  pushfq\n  andq $~0x240000, (%rsp)\n  popfq\n");
BODY(iretq_iopl3,
     IRETQ_FRAME(0x3002) "  iretq\n1:\n  pushfq\n  popq %r13\n  andq $~0x200, %r13\n"
     "  pushfq\n  andq $~0x3000, (%rsp)\n  popfq\n");
BODY(iretl,
     "  subq $20, %rsp\n  movl $0x10, 16(%rsp)\n  leaq 20(%rsp), %rax\n"
     "  movl %eax, 12(%rsp)\n  movl $0x2d7, 8(%rsp)\n  movl $0x08, 4(%rsp)\n"
     "  leaq 1f(%rip), %rax\n  movl %eax, (%rsp)\n  iretl\n1:\n  ud2\n  cli\n");

/* -- mov from a control register ----------------------------------------- */
BODY(mov_from_cr0, "  movq %cr0, %rax\n");
BODY(mov_from_cr3_r9, "  movq %cr3, %r9\n");
BODY(mov_from_cr4, "  movq %cr4, %rdx\n");
BODY(mov_from_cr8, "  .byte 0x44, 0x0f, 0x20, 0xc1\n");   /* mov %cr8, %rcx */
BODY(mov_from_cr0_mod0, "  .byte 0x0f, 0x20, 0x00\n");    /* mod ignored: rax */
BODY(mov_from_cr0_opsize, "  .byte 0x66, 0x0f, 0x20, 0xc6\n"); /* mov %cr0, %rsi */
BODY(mov_from_cr0_rex_before_prefix, "  .byte 0x41, 0x66, 0x0f, 0x20, 0xc0\n"); /* rax */
BODY(mov_from_cr0_two_rex, "  .byte 0x48, 0x41, 0x0f, 0x20, 0xc0\n");   /* r8 */
BODY(mov_from_cr4_r15, "  movq %cr4, %r15\n");
BODY(mov_from_cr3_rsp,
     "  movq %rsp, %rbx\n  movq %cr3, %rsp\n  movq %rsp, %rdi\n  movq %rbx, %rsp\n");
BODY(mov_from_cr2_after_pf,
     "  leaq 1f(%rip), %rax\n  movq %rax, resume_at(%rip)\n  movq 0x28, %rax\n1:\n"
     "  movq %cr2, %r15\n");

/* -- wrmsr and rdmsr: the bases, upper register halves ignored ----------- */
BODY(wrmsr_fs_base,
     "  movabsq $0xdead0000c0000100, %rcx\n  leaq probe_block(%rip), %rax\n"
     "  movabsq $0x7777777700000000, %rdx\n  orq %rdx, %rax\n"
     "  movabsq $0x5555555500000000, %rdx\n  wrmsr\n  movq %fs:8, %rdi\n");
BODY(rdmsr_fs_base, "  movabsq $0xdead0000c0000100, %rcx\n  rdmsr\n");
BODY(wrmsr_gs_base_high, WRMSR(0xc0000101, 0xffff800000123000) RDMSR(0xc0000101));
BODY(wrmsr_kernel_gs_base, WRMSR(0xc0000102, 0x00007fffabcde000) RDMSR(0xc0000102));
BODY(wrmsr_fs_noncanonical, WRMSR(0xc0000100, 0x0000800000000000) RDMSR(0xc0000100));
BODY(wrmsr_gs_noncanonical, WRMSR(0xc0000101, 0x0000800000000000) RDMSR(0xc0000101));
BODY(wrmsr_kernel_gs_noncanonical,
     WRMSR(0xc0000102, 0x0000800000000000) RDMSR(0xc0000102));
BODY(wrmsr_kernel_gs_noncanonical_high,
     WRMSR(0xc0000102, 0x1234000000000000) RDMSR(0xc0000102));

/* -- swapgs --------------------------------------------------------------- */
BODY(swapgs,
     "  leaq probe_block+16(%rip), %rax\n  xorl %edx, %edx\n  movl $0xc0000102, %ecx\n"
     "  wrmsr\n" WRMSR(0xc0000101, 0x9000)
     "  swapgs\n  movq %gs:0, %r8\n" RDMSR(0xc0000101) "  movq %rax, %r9\n"
     RDMSR(0xc0000102) "  movq %rax, %r10\n  swapgs\n" RDMSR(0xc0000101));

/* -- invlpg, wbinvd, invd: no visible effect ------------------------------ */
BODY(invlpg_base, "  leaq probe_block(%rip), %rbx\n  invlpg (%rbx)\n");
BODY(invlpg_sib, "  leaq probe_block(%rip), %rbx\n  movl $3, %ecx\n"
     "  invlpg 0x1000(%rbx,%rcx,4)\n");
BODY(invlpg_rip, "  invlpg probe_block(%rip)\n");
BODY(wbinvd, "  wbinvd\n");
BODY(invd, "  invd\n");

/* -- int n: an interrupt gate (IF off inside) and a trap gate (IF kept) -- */
BODY(int_interrupt_gate, "  sti\n  int $0x21\n  cli\n");
BODY(int_trap_gate, "  sti\n  int $0x22\n  cli\n");
BODY(int_n_other_vector, "  int $0x2f\n");

/* -- exceptions delivered to the guest's handlers ------------------------- */
BODY(pf_read_zero_page, "  movq 0x18, %rax\n");
BODY(pf_write_zero_page, "  movq %rax, 0x30\n");
BODY(pf_write_read_only, "  movq %rax, read_only_word(%rip)\n");
BODY(pf_fetch_no_execute, "  leaq probe_block(%rip), %rax\n  call *%rax\n");
BODY(gp_noncanonical, "  movabsq $0x8000000000000000, %rax\n  movq (%rax), %rax\n");
BODY(de_divide, "  xorl %ecx, %ecx\n  movl $1, %eax\n  xorl %edx, %edx\n  divl %ecx\n");

/* -- only in their own runs ----------------------------------------------- */
BODY(int3, "  int3\n");
BODY(idt_limit, "  subq $16, %rsp\n  movw $0x3f, (%rsp)\n  leaq idt_a(%rip), %rax\n"
     "  movq %rax, 2(%rsp)\n  lidt (%rsp)\n  ud2\n");
BODY(hlt, "  hlt\n");
/* An iretq to a DPL 3 code descriptor of the guest's: a return to CPL 3. */
BODY(iretq_to_outer_level,
     "  lgdt gdtrs+200(%rip)\n  movq %rsp, %rax\n  pushq $0x10\n  pushq %rax\n  pushq $2\n"
     "  pushq $0x0b\n  leaq 1f(%rip), %rcx\n  pushq %rcx\n  iretq\n1:\n");

struct oracle_case {
    const char *name;
    void (*body)(void);
};

#define CASE(name) { #name, body_##name }
static const struct oracle_case cases[] = {
    CASE(cli), CASE(sti), CASE(cli_twice), CASE(pushf_after_cli),
    CASE(ltr_reg), CASE(ltr_mem), CASE(ltr_r9), CASE(ltr_busy),
    CASE(lgdt_base), CASE(lgdt_disp8), CASE(lgdt_disp32), CASE(lgdt_rip),
    CASE(lgdt_sib), CASE(lgdt_sib_nobase), CASE(lgdt_rsp), CASE(lgdt_r13),
    CASE(lgdt_r12_index), CASE(lgdt_addr32), CASE(lgdt_fs), CASE(lgdt_gs),
    CASE(lgdt_opsize), CASE(lgdt_rexw), CASE(lgdt_rip_rexb), CASE(lgdt_cs_prefix),
    CASE(lgdt_ss_prefix_rsp_disp), CASE(lgdt_rex_before_prefix), CASE(lgdt_addr32_sib),
    CASE(lgdt_main),
    CASE(lidt_base), CASE(lidt_rip), CASE(lidt_sib), CASE(lidt_rsp), CASE(lidt_gs),
    CASE(lidt_addr32), CASE(lidt_rexw), CASE(lidt_a),
    CASE(mov_ds_reg), CASE(mov_es_mem), CASE(mov_ds_opsize), CASE(mov_ss_reg),
    CASE(mov_ss_rsp_mem), CASE(mov_ss_fs_mem), CASE(mov_ss_rpl1), CASE(mov_ss_rpl3), CASE(mov_fs_base), CASE(mov_gs_base),
    CASE(lretq), CASE(lretq_imm), CASE(lretl), CASE(lretl_imm),
    CASE(lretq_high_selector_bits),
    CASE(iretq_if_on), CASE(iretq_if_off), CASE(iretq_other_stack), CASE(iretq_cs_rpl3),
    CASE(iretq_ss_rpl3), CASE(iretq_ac_id),
    CASE(iretq_iopl3), CASE(iretl),
    CASE(mov_from_cr0), CASE(mov_from_cr3_r9), CASE(mov_from_cr4), CASE(mov_from_cr8),
    CASE(mov_from_cr0_mod0), CASE(mov_from_cr0_opsize), CASE(mov_from_cr0_rex_before_prefix),
    CASE(mov_from_cr0_two_rex), CASE(mov_from_cr4_r15), CASE(mov_from_cr3_rsp),
    CASE(mov_from_cr2_after_pf),
    CASE(wrmsr_fs_base), CASE(rdmsr_fs_base), CASE(wrmsr_gs_base_high),
    CASE(wrmsr_kernel_gs_base), CASE(wrmsr_fs_noncanonical),
    CASE(wrmsr_gs_noncanonical), CASE(wrmsr_kernel_gs_noncanonical),
    CASE(wrmsr_kernel_gs_noncanonical_high),
    CASE(swapgs),
    CASE(invlpg_base), CASE(invlpg_sib), CASE(invlpg_rip), CASE(wbinvd), CASE(invd),
    CASE(pf_read_zero_page), CASE(pf_write_zero_page), CASE(pf_write_read_only), CASE(pf_fetch_no_execute),
    CASE(gp_noncanonical), CASE(de_divide),
};
/* Cases KVM cannot execute at CPL 0 here (int3, int n: an internal error
 * exit) or that end the run (hlt): each in a run of its own. */
static const struct oracle_case own_runs[] = {
    CASE(int3), CASE(int_interrupt_gate), CASE(int_trap_gate), CASE(int_n_other_vector),
    CASE(hlt), CASE(idt_limit), CASE(iretq_to_outer_level),
};

static uint64_t read_cr2(void)
{
    uint64_t cr2;
    __asm__ __volatile__("mov %%cr2, %0" : "=r"(cr2));
    return cr2;
}

static void name_stack(char *out, uint64_t at)
{
    for (int k = 0; k < NTSS; k++) {
        uint64_t lo = (uint64_t)(uintptr_t)ist_stack[k];
        if (at > lo && at <= lo + IST_SIZE) {
            rt_snprintf(out, 16, "ist%d", k);
            return;
        }
    }
    rt_snprintf(out, 16, "cur-%llx", (unsigned long long)(saved_rsp - at));
}

void trap_handler(struct trap_frame *f);
void trap_handler(struct trap_frame *f)
{
    if (seen_count < MAX_TRAPS) {
        struct seen *s = &seen[seen_count];
        s->vector = f->vector;
        s->error = f->error_code;
        s->rip = f->rip;
        s->cs = f->cs;
        s->rflags = f->rflags;
        s->rsp = f->rsp;
        s->ss = f->ss;
        s->cr2 = f->vector == 14 ? read_cr2() : 0;
        name_stack(s->stack, (uint64_t)(uintptr_t)f);
    }
    seen_count++;
    const uint8_t *at = (const uint8_t *)(uintptr_t)f->rip;
    if (f->vector == 0x21 || f->vector == 0x22) {
        __asm__ __volatile__("ud2" ::: "memory"); /* the IF inside the handler */
    } else if (resume_at != 0) {
        f->rip = resume_at;
        resume_at = 0;
    } else if (f->vector == 6 && at[0] == 0x0f && at[1] == 0x0b) {
        f->rip += 2;      /* a probe: go on after it */
    } else if (f->vector != 3 && f->vector < 32) {
        f->rip = (uint64_t)(uintptr_t)case_after;  /* a fault ends the case */
        f->rsp = saved_rsp - 8;
    }
}

static uint64_t pattern(int i)
{
    return 0x0101010101010101ULL * (uint64_t)(0x10 + i) ^ 0x8000000000000000ULL;
}

static void run_one(const struct oracle_case *c)
{
    for (int i = 0; i < 16; i++)
        case_in[i] = pattern(i);
    seen_count = 0;
    resume_at = 0;
    case_body = c->body;
    run_case();
    rt_printf("case %s:", c->name);
    for (int i = 0; i < 16; i++) {
        if (i == 4) {
            int64_t delta = (int64_t)(case_out[4] - saved_rsp);
            if (delta != 0)
                rt_printf(" rsp=%s%llx", delta < 0 ? "-" : "+",
                          (unsigned long long)(delta < 0 ? -delta : delta));
        } else if (case_out[i] != case_in[i]) {
            rt_printf(" %s=%llx", GPR[i], (unsigned long long)case_out[i]);
        }
    }
    rt_printf(" fl=%llx", (unsigned long long)(case_flags & ~0x200ULL));
    for (int t = 0; t < seen_count && t < MAX_TRAPS; t++) {
        const struct seen *s = &seen[t];
        rt_printf(" t=%llu/%llx/%llx/%llx/%llx/%llx/%llx/%s",
                  (unsigned long long)s->vector, (unsigned long long)s->error,
                  (unsigned long long)s->rip, (unsigned long long)s->cs,
                  (unsigned long long)s->rflags, (unsigned long long)s->rsp,
                  (unsigned long long)s->ss, s->stack);
        if (s->vector == 14)
            rt_printf("/cr2=%llx", (unsigned long long)s->cr2);
    }
    if (seen_count > MAX_TRAPS)
        rt_printf(" traps=%d", seen_count);
    rt_puts("\n");
}

static void set_gate(struct gate *idt, int v, int ist, int type)
{
    uint64_t addr = (uint64_t)(uintptr_t)(trap_entries + 16 * v);
    idt[v].offset_lo = addr & 0xffff;
    idt[v].selector = 0x08;
    idt[v].ist = ist;
    idt[v].type_attr = 0x80 | type; /* present, DPL 0, 64-bit gate */
    idt[v].offset_mid = (addr >> 16) & 0xffff;
    idt[v].offset_hi = addr >> 32;
}

static void tss_descriptor(uint64_t *slot, int k)
{
    uint64_t base = (uint64_t)(uintptr_t)&tss[k], limit = sizeof(tss[k]) - 1;
    slot[0] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89ULL << 40) |
              (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    slot[1] = base >> 32;
}

/* Solo5's start-up sequence (wrmsr aside), with more TSSes and IDTs. */
static void cpu_init(void)
{
    for (int k = 0; k < NTSS; k++) {
        tss[k].ist[0] = (uint64_t)(uintptr_t)(ist_stack[k] + IST_SIZE);
        tss[k].iomap_base = sizeof(tss[k]);
    }
    gdt[0] = 0;
    gdt[1] = 0x00af99000000ffffULL;
    gdt[2] = 0x00cf93000000ffffULL;
    for (int d = 0; d < 4; d++)           /* 0x18, 0x28, 0x38, 0x48 */
        tss_descriptor(&gdt[3 + 2 * d], d);
    for (int k = 1; k < NGDT; k++) {      /* copy k: its own TSS at 0x18 */
        for (int w = 0; w < GDT_WORDS; w++)
            gdts[k - 1][w] = gdt[w];
        tss_descriptor(&gdts[k - 1][3], 3 + k);
        gdtrs[k].limit = sizeof(gdt) - 1;
        gdtrs[k].base = (uint64_t)(uintptr_t)gdts[k - 1];
    }
    for (int w = 0; w < GDT_WORDS; w++)   /* the last: user-mode code at 0x08 */
        gdts[NGDT - 1][w] = gdt[w];
    gdts[NGDT - 1][1] = 0x00affb000000ffffULL;
    gdtrs[NGDT].limit = sizeof(gdt) - 1;
    gdtrs[NGDT].base = (uint64_t)(uintptr_t)gdts[NGDT - 1];
    gdtrs[0].limit = sizeof(gdt) - 1;
    gdtrs[0].base = (uint64_t)(uintptr_t)gdt;
    for (int v = 0; v < GATES; v++) {
        int type = v == 0x22 ? 0xf : 0xe; /* 0x22: a trap gate */
        set_gate(idt_a, v, v == 6 ? 1 : 0, type);
        set_gate(idt_b, v, 0, type);
    }
    idtrs[0].limit = idtrs[1].limit = sizeof(idt_a) - 1;
    idtrs[0].base = (uint64_t)(uintptr_t)idt_a;
    idtrs[1].base = (uint64_t)(uintptr_t)idt_b;

    __asm__ __volatile__(
        "lgdt gdtrs(%%rip)\n"
        "pushq $0x08\n"
        "leaq 1f(%%rip), %%rax\n"
        "pushq %%rax\n"
        "lretq\n"
        "1:\n"
        "movl $0x10, %%eax\n"
        "movl %%eax, %%ss\n"
        "movl %%eax, %%ds\n"
        "movl %%eax, %%es\n"
        "movl $0x18, %%eax\n"
        "ltr %%ax\n"
        "lidt idtrs(%%rip)\n"
        "cli\n"
        : : : "rax", "memory");
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    const struct oracle_case *only = NULL;
    for (size_t i = 0; i < sizeof(own_runs) / sizeof(own_runs[0]); i++)
        if (strcmp(p, own_runs[i].name) == 0)
            only = &own_runs[i];
    if (*p != '\0' && only == NULL) {
        rt_puts("FAILURE: usage: emuoracle [CASE], CASE one of: int3 int_interrupt_gate "
                "int_trap_gate int_n_other_vector hlt\n");
        return SOLO5_EXIT_FAILURE;
    }
    cpu_init();
    rt_puts("emuoracle: start-up sequence ok\n");
    if (only != NULL) {
        run_one(only);
    } else {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            run_one(&cases[i]);
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

/*
 * solo5seq: the privileged start-up sequence of Solo5's hvt bindings, done
 * by a guest that (like every unmodified Solo5 unikernel) carries no pyvmm
 * capability note, so pyvmm must run it at CPL 0 or deprivileged
 * (docs/pvm.md).  In order, as ../shared/spec/solo5-hvt-abi.md lists them:
 *
 *   rdtsc twice; wrmsr IA32_FS_BASE; its own 5-entry GDT, lgdt, a far
 *   return to selector 0x08 and 0x10 loaded into SS/DS/ES; a TSS with three
 *   IST stacks, ltr 0x18; a 48-gate IDT on those stacks, lidt; cli/sti.
 *
 * Then it checks what it can see: the FS base reaches %fs-relative loads;
 * a deliberate #UD (ud2), #PF (a load from page zero, reading CR2 in the
 * handler) and #GP (a non-canonical load) reach its own handlers on the
 * IST stack they name, with the right vector, error code and CR2, and
 * return with iretq.  (Not checked: the selectors `mov %cs` reads back,
 * which kvm_pvm shows as its own user selectors at CPL 3; Solo5 never
 * reads them.  Nor int3, which kvm_pvm's CPL 0 emulator cannot execute.)
 * Finally a compute loop, so tests compare speed at both levels (same
 * checksum).
 *
 *   solo5seq.hvt [KIB]          checks, then KIB KiB of compute (default 64)
 *   solo5seq.hvt abort          a page fault whose handler reports like
 *                               Solo5's ("Solo5: trap: type=#PF ...") and
 *                               aborts: exit status 255
 *   solo5seq.hvt traps N        after the sequence, N cli/sti pairs: prints
 *                               trap_ns, the average cost of one (a trap
 *                               and its emulation when deprivileged)
 *   solo5seq.hvt cr3            reloads CR3 (mov to CR3), which Solo5 never
 *                               does and pyvmm does not emulate: fine at
 *                               CPL 0, one line and status 1 deprivileged
 *
 * Output: "solo5seq: <check> ok" lines, "checksum: 0x...", "elapsed_us: N",
 * "SUCCESS"; any failed check prints "FAILURE: ..." and exits 1.
 */
#include "rt.h"

GUEST_MANIFEST();

#define MSR_FS_BASE 0xc0000100u
#define IST_STACK_SIZE 4096
#define GATES 48

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

/* What the CPU pushes, plus the vector and error code our entry adds. */
struct trap_frame {
    uint64_t vector;
    uint64_t error_code;
    uint64_t rip, cs, rflags, rsp, ss;
};

static uint64_t gdt[5] __attribute__((aligned(16)));
static struct tss tss __attribute__((aligned(16)));
static struct gate idt[GATES] __attribute__((aligned(16)));
static uint8_t ist_stack[3][IST_STACK_SIZE] __attribute__((aligned(16)));
static uint64_t tls_block[2] = { 0x5eed5010c0ffee00ULL, 0 };

/* Filled in by the handlers. */
static volatile uint64_t seen_vector, seen_error, seen_cr2, seen_rsp;
static volatile uint64_t resume_at;
static volatile int seen_count;
static int abort_mode;

extern char trap_entries[];   /* GATES entries of 16 bytes each (below) */

/*
 * Trap entry: every vector pushes a dummy error code where the CPU pushes
 * none, then its number, and jumps to a common path that saves the
 * caller-saved registers, calls trap_handler(frame) and returns with iretq.
 */
__asm__(
    ".text\n"
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
    "  iretq\n");

static uint64_t read_cr2(void)
{
    uint64_t cr2;
    __asm__ __volatile__("mov %%cr2, %0" : "=r"(cr2));
    return cr2;
}

static const char *vector_name(uint64_t v)
{
    switch (v) {
    case 6: return "#UD";
    case 13: return "#GP";
    case 14: return "#PF";
    default: return "#??";
    }
}

void trap_handler(struct trap_frame *f);
void trap_handler(struct trap_frame *f)
{
    uint64_t here;
    __asm__ __volatile__("movq %%rsp, %0" : "=r"(here));
    seen_vector = f->vector;
    seen_error = f->error_code;
    seen_rsp = here;
    seen_count++;
    if (f->vector == 14)
        seen_cr2 = read_cr2();
    if (abort_mode || resume_at == 0) {
        /* As Solo5's handler reports a trap, then aborts. */
        rt_printf("Solo5: trap: type=%s ec=0x%llx rip=0x%llx rsp=0x%llx rflags=0x%llx\n",
                  vector_name(f->vector), (unsigned long long)f->error_code,
                  (unsigned long long)f->rip, (unsigned long long)f->rsp,
                  (unsigned long long)f->rflags);
        if (f->vector == 14)
            rt_printf("Solo5: trap: cr2=0x%llx\n", (unsigned long long)seen_cr2);
        solo5_abort();
    }
    f->rip = resume_at;  /* go on after the faulting instruction */
    resume_at = 0;
}

static int fail(const char *what)
{
    rt_printf("FAILURE: %s\n", what);
    return SOLO5_EXIT_FAILURE;
}

static void set_gate(int v, int ist)
{
    uint64_t addr = (uint64_t)(uintptr_t)(trap_entries + 16 * v);
    idt[v].offset_lo = addr & 0xffff;
    idt[v].selector = 0x08;
    idt[v].ist = ist;
    idt[v].type_attr = 0x8e; /* present, DPL 0, 64-bit interrupt gate */
    idt[v].offset_mid = (addr >> 16) & 0xffff;
    idt[v].offset_hi = addr >> 32;
}

static void cpu_init(void)
{
    uint64_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));

    uint64_t fs = (uint64_t)(uintptr_t)tls_block;
    __asm__ __volatile__("wrmsr" : : "c"(MSR_FS_BASE), "a"((uint32_t)fs),
                         "d"((uint32_t)(fs >> 32)));

    /* The GDT of Solo5's cpu_init: null, code, data, a 64-bit TSS. */
    uint64_t base = (uint64_t)(uintptr_t)&tss, limit = sizeof(tss) - 1;
    gdt[0] = 0;
    gdt[1] = 0x00af99000000ffffULL;
    gdt[2] = 0x00cf93000000ffffULL;
    gdt[3] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89ULL << 40) |
             (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    gdt[4] = base >> 32;
    struct table_ptr gdtr = { sizeof(gdt) - 1, (uint64_t)(uintptr_t)gdt };
    __asm__ __volatile__(
        "lgdt %0\n"
        "pushq $0x08\n"
        "leaq 1f(%%rip), %%rax\n"
        "pushq %%rax\n"
        "lretq\n"
        "1:\n"
        "movl $0x10, %%eax\n"
        "movl %%eax, %%ss\n"
        "movl %%eax, %%ds\n"
        "movl %%eax, %%es\n"
        : : "m"(gdtr) : "rax", "memory");

    for (int i = 0; i < 3; i++)
        tss.ist[i] = (uint64_t)(uintptr_t)(ist_stack[i] + IST_STACK_SIZE);
    tss.iomap_base = sizeof(tss);
    __asm__ __volatile__("ltr %w0" : : "r"(0x18));

    /* As Solo5: exceptions 0-20 but 9 and 15 on IST2 (2 and 8 on IST3),
     * 32-47 on IST1. */
    for (int v = 0; v <= 20; v++)
        if (v != 9 && v != 15)
            set_gate(v, v == 2 || v == 8 ? 3 : 2);
    for (int v = 32; v < GATES; v++)
        set_gate(v, 1);
    struct table_ptr idtr = { sizeof(idt) - 1, (uint64_t)(uintptr_t)idt };
    __asm__ __volatile__("lidt %0" : : "m"(idtr) : "memory");

    __asm__ __volatile__("cli");
    __asm__ __volatile__("sti");
}

/* The handler ran on IST2, with our code selector (RPL aside). */
static bool on_ist2(void)
{
    uint64_t lo = (uint64_t)(uintptr_t)ist_stack[1];
    return seen_rsp > lo && seen_rsp <= lo + IST_STACK_SIZE;
}

static uint64_t mix(uint64_t *w, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        w[i] = (i + 1) * 0x9e3779b97f4a7c15ULL ^ 0x0123456789abcdefULL;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    return h;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint64_t kib = 64;
    abort_mode = strcmp(p, "abort") == 0;
    bool cr3_mode = strcmp(p, "cr3") == 0;
    uint64_t traps = 0;
    if (strncmp(p, "traps ", 6) == 0) {
        p += 6;
        if (!rt_parse_u64(&p, &traps) || traps == 0 || traps > 10000000)
            return fail("usage: solo5seq traps N (N 1-10000000)");
    } else if (!abort_mode && !cr3_mode && *p != '\0' &&
               (!rt_parse_u64(&p, &kib) || kib == 0 || kib > 65536)) {
        return fail("usage: solo5seq [KIB | abort | cr3 | traps N]");
    }

    cpu_init();
    rt_puts("solo5seq: start-up sequence ok\n");

    uint64_t via_fs;
    __asm__ __volatile__("movq %%fs:0, %0" : "=r"(via_fs));
    if (via_fs != tls_block[0])
        return fail("the FS base set with wrmsr does not reach %fs loads");
    rt_puts("solo5seq: fs base ok\n");

    if (traps) {
        solo5_time_t t0 = solo5_clock_monotonic();
        for (uint64_t i = 0; i < traps; i++)
            __asm__ __volatile__("cli; sti" ::: "memory");
        solo5_time_t t1 = solo5_clock_monotonic();
        rt_printf("trap_ns: %llu\n", (unsigned long long)((t1 - t0) / (2 * traps)));
        rt_puts("SUCCESS\n");
        return SOLO5_EXIT_SUCCESS;
    }
    if (cr3_mode) {
        __asm__ __volatile__("mov %%cr3, %%rax; mov %%rax, %%cr3" : : : "rax", "memory");
        rt_puts("solo5seq: cr3 reloaded\n");
        return SOLO5_EXIT_SUCCESS;
    }
    if (abort_mode) {
        uint64_t v;                  /* the handler reports and aborts */
        __asm__ __volatile__("movq 0x10, %0" : "=r"(v) : : "memory");
        (void)v;
        return fail("the page fault did not happen");
    }

    __asm__ __volatile__("leaq 1f(%%rip), %%rax; movq %%rax, %0; ud2; 1:"
                         : "=m"(resume_at) : : "rax", "memory");
    if (seen_count != 1 || seen_vector != 6 || !on_ist2())
        return fail("ud2 did not reach the #UD handler on IST2");
    rt_puts("solo5seq: #UD ok\n");

    __asm__ __volatile__("leaq 1f(%%rip), %%rax; movq %%rax, %0;"
                         "movq 0x18, %%rax; 1:"
                         : "=m"(resume_at) : : "rax", "memory");
    if (seen_count != 2 || seen_vector != 14 || seen_cr2 != 0x18 || !on_ist2())
        return fail("a load from page zero did not reach the #PF handler with CR2");
    if (seen_error != 0)  /* not present, read, supervisor */
        return fail("the #PF error code is not that of a supervisor read");
    rt_puts("solo5seq: #PF and cr2 ok\n");

    __asm__ __volatile__("leaq 1f(%%rip), %%rax; movq %%rax, %0;"
                         "movabsq $0x8000000000000000, %%rax; movq (%%rax), %%rax; 1:"
                         : "=m"(resume_at) : : "rax", "memory");
    if (seen_count != 3 || seen_vector != 13 || seen_error != 0 || !on_ist2())
        return fail("a non-canonical load did not reach the #GP handler");
    rt_puts("solo5seq: #GP ok\n");

    size_t words = kib * 1024 / 8;
    uint64_t *buf = rt_alloc(kib * 1024, 4096);
    if (buf == NULL)
        return fail("cannot allocate the compute buffer");
    solo5_time_t t0 = solo5_clock_monotonic();
    uint64_t h = mix(buf, words);
    solo5_time_t t1 = solo5_clock_monotonic();
    rt_printf("checksum: 0x%016llx\n", (unsigned long long)h);
    rt_printf("elapsed_us: %llu\n", (unsigned long long)((t1 - t0) / 1000));
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

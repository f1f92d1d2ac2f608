/*
 * CPU exceptions as Solo5's bindings report them (x86_64, solo5_pyvmm.o
 * only): one line naming the trap, then an ABORT line and exit status 255.
 *
 * Only at CPL 0 (a stock solo5-hvt, pyvmm --cpl=0, pyvmm on a host with
 * hardware virtualisation), where loading an IDT is ours to do.  At CPL 3
 * (pyvmm's user mode on a PVM host) the guest cannot load one: a trap ends
 * the guest and pyvmm reports it ("pyvmm: guest fault: ...", status 1).
 * Handlers run on a stack of their own (IST 1 of a TSS of ours), so that a
 * fault of a broken stack is reported too.  The runtime's GDT keeps the
 * hvt ABI's selectors (code 0x08, data 0x10) and adds the TSS's.
 */
#include "hypercall.h"
#include "rt_internal.h"

#define VECTORS 32
#define STUB_SIZE 16
#define GATE_INTERRUPT 0x8e /* present, DPL 0, 64-bit interrupt gate */

struct idt_gate {
    uint16_t offset_lo;
    uint16_t selector;
    uint8_t ist;
    uint8_t attributes;
    uint16_t offset_mid;
    uint32_t offset_hi;
    uint32_t reserved;
};
_Static_assert(sizeof(struct idt_gate) == 16, "64-bit IDT gates are 16 bytes");

struct __attribute__((packed)) idt_pointer {
    uint16_t limit;
    uint64_t base;
};

struct __attribute__((packed)) tss64 {
    uint32_t reserved0;
    uint64_t rsp[3];
    uint64_t reserved1;
    uint64_t ist[7];
    uint64_t reserved2;
    uint16_t reserved3;
    uint16_t iomap_base;
};
_Static_assert(sizeof(struct tss64) == 104, "the 64-bit TSS is 104 bytes");

/* The hvt ABI's selectors, and the TSS's. */
#define SEL_CODE 0x08
#define SEL_DATA 0x10
#define SEL_TSS 0x18
#define TRAP_STACK_SIZE 8192

static struct idt_gate idt[VECTORS] __attribute__((aligned(16)));
static struct tss64 tss __attribute__((aligned(16)));
static uint64_t gdt[5] __attribute__((aligned(16)));
static uint8_t trap_stack[TRAP_STACK_SIZE] __attribute__((aligned(16)));

extern const char rt_trap_stubs[]; /* trap_entry.S */

static const char *const names[VECTORS] = {
    [0] = "#DE", [1] = "#DB", [2] = "NMI", [3] = "#BP", [4] = "#OF",
    [5] = "#BR", [6] = "#UD", [7] = "#NM", [8] = "#DF", [10] = "#TS",
    [11] = "#NP", [12] = "#SS", [13] = "#GP", [14] = "#PF", [16] = "#MF",
    [17] = "#AC", [18] = "#MC", [19] = "#XM", [20] = "#VE", [21] = "#CP",
};

/* Our GDT: the tender's two segments (the same descriptors, so the loaded
 * segment registers stay valid) and a TSS whose IST 1 is the trap stack. */
static void load_gdt_and_tss(void)
{
    uint64_t base = (uint64_t)(uintptr_t)&tss;
    uint64_t limit = sizeof(tss) - 1;

    tss.ist[0] = (uint64_t)(uintptr_t)(trap_stack + TRAP_STACK_SIZE);
    tss.iomap_base = sizeof(tss); /* no I/O bitmap: CPL 0 needs none */
    gdt[0] = 0;
    gdt[SEL_CODE / 8] = 0x00af9b000000ffffULL; /* 64-bit code, DPL 0 */
    gdt[SEL_DATA / 8] = 0x00cf93000000ffffULL; /* data, DPL 0 */
    gdt[SEL_TSS / 8] = (limit & 0xffff) | ((base & 0xffffff) << 16) |
                       (0x89ULL << 40) | (((limit >> 16) & 0xf) << 48) |
                       (((base >> 24) & 0xff) << 56);
    gdt[SEL_TSS / 8 + 1] = base >> 32;
    struct idt_pointer p = { .limit = sizeof(gdt) - 1, .base = (uintptr_t)gdt };
    __asm__ __volatile__("lgdt %0" : : "m"(p) : "memory");
    __asm__ __volatile__("ltr %w0" : : "r"((uint16_t)SEL_TSS) : "memory");
}

void rt_traps_init(void)
{
    if (rt_cpl() != 0)
        return; /* user mode: lidt would fault */
    uint16_t cs;
    __asm__ __volatile__("mov %%cs, %0" : "=r"(cs));
    if (cs != SEL_CODE)
        return; /* not the hvt ABI's state: leave the tables alone */
    load_gdt_and_tss();
    for (int v = 0; v < VECTORS; v++) {
        uint64_t at = (uint64_t)(uintptr_t)(rt_trap_stubs + v * STUB_SIZE);
        idt[v] = (struct idt_gate){
            .offset_lo = (uint16_t)at,
            .selector = cs,
            .ist = 1,
            .attributes = GATE_INTERRUPT,
            .offset_mid = (uint16_t)(at >> 16),
            .offset_hi = (uint32_t)(at >> 32),
            .reserved = 0,
        };
    }
    struct idt_pointer p = { .limit = sizeof(idt) - 1, .base = (uintptr_t)idt };
    __asm__ __volatile__("lidt %0" : : "m"(p) : "memory");
}

/* frame: error code (0 where the CPU pushes none), RIP, CS, RFLAGS, RSP. */
void rt_trap(uint64_t vector, const uint64_t *frame) __attribute__((noreturn));
void rt_trap(uint64_t vector, const uint64_t *frame)
{
    const char *name = vector < VECTORS && names[vector] ? names[vector] : "?";
    uint64_t cr2 = 0;

    if (vector == 14)
        __asm__ __volatile__("mov %%cr2, %0" : "=r"(cr2));
    rt_printf("pyvmm-rt: trap: vector %lu (%s) ec=0x%lx rip=0x%lx rsp=0x%lx "
              "rflags=0x%lx cr2=0x%lx\n",
              (unsigned long)vector, name, (unsigned long)frame[0],
              (unsigned long)frame[1], (unsigned long)frame[4],
              (unsigned long)frame[3], (unsigned long)cr2);
    rt_puts("pyvmm-rt: ABORT: fatal trap\n");
    rt_halt(SOLO5_EXIT_ABORT, NULL);
}

/*
 * edges: the edges of the hvt transport, one case per run.
 *
 * Every run first prints "mem_size: 0x..." (the boot info's, as the guest
 * sees it), then:
 *
 *     edges.hvt exit N        solo5_exit((int)N): N may exceed 255 or, as
 *                             4294967295, be -1; the host exits N & 0xff
 *     edges.hvt cookie N      halt with status N and an abort cookie that
 *                             points to 512 readable bytes (its data)
 *     edges.hvt cookie_text N the same with the cookie in the read-only text:
 *                             readable is all a cookie must be
 *     edges.hvt cookie_out    halt (status 3) with a cookie straddling the
 *                             end of guest memory: a guest error
 *     edges.hvt port          a 4-byte write to a port that is no hypercall
 *     edges.hvt width         a 1-byte write to the walltime hypercall port
 *     edges.hvt direction     a 4-byte read from the walltime hypercall port
 *
 * The three last and cookie_out must end the run (pyvmm: exit status 1, one
 * line); if the host carries on the guest prints "FAILURE: not stopped" and
 * exits 2.
 */
#include "hypercall.h"
#include "rt.h"
#include "rt_internal.h"

GUEST_MANIFEST();

static uint8_t cookie[HVT_HALT_COOKIE_MAX];

static int streq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static int starts(const char *s, const char *word, const char **rest)
{
    size_t n = strlen(word);
    if (strncmp(s, word, n) != 0 || (s[n] != ' ' && s[n] != '\0'))
        return 0;
    *rest = rt_skip_spaces(s + n);
    return 1;
}

static void not_stopped(void)
{
    rt_puts("FAILURE: not stopped\n");
    solo5_exit(2);
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *what = rt_skip_spaces(si->cmdline);
    const char *rest;
    uint64_t n = 0;
    uint16_t walltime = HVT_HYPERCALL_PIO_BASE + HVT_HYPERCALL_WALLTIME;

    rt_printf("mem_size: 0x%lx\n", (unsigned long)rt_boot_info()->mem_size);
    rt_printf("edges: %s\n", what);
    for (size_t i = 0; i < sizeof cookie; i++)
        cookie[i] = (uint8_t)i;
    if (starts(what, "exit", &rest) && rt_parse_u64(&rest, &n)) {
        solo5_exit((int)n);
    } else if (starts(what, "cookie", &rest) && rt_parse_u64(&rest, &n)) {
        rt_halt((int)n, cookie);
    } else if (starts(what, "cookie_text", &rest) && rt_parse_u64(&rest, &n)) {
        rt_halt((int)n, (void *)(uintptr_t)0x100000);
    } else if (streq(what, "cookie_out")) {
        rt_halt(3, (void *)(uintptr_t)(rt_boot_info()->mem_size - HVT_HALT_COOKIE_MAX / 2));
    } else if (streq(what, "port")) {
        __asm__ __volatile__("outl %0, %1" : : "a"(0u), "d"((uint16_t)0x600) : "memory");
        not_stopped();
    } else if (streq(what, "width")) {
        __asm__ __volatile__("outb %0, %1" : : "a"((uint8_t)0), "d"(walltime) : "memory");
        not_stopped();
    } else if (streq(what, "direction")) {
        uint32_t v;
        __asm__ __volatile__("inl %1, %0" : "=a"(v) : "d"(walltime) : "memory");
        (void)v;
        not_stopped();
    }
    rt_puts("FAILURE: unknown case\n");
    return SOLO5_EXIT_FAILURE;
}

/*
 * What the runtime adds when it is built as Solo5 bindings (solo5_pyvmm.o,
 * compiled with RT_SOLO5_BINDINGS): the parts of Solo5's contract that a
 * program built with Solo5's toolchain relies on and that pyvmm's own
 * guests do not use.
 *
 *   - the stack protector: Solo5's compiler wrapper builds every program
 *     with -fstack-protector-strong and a global guard, so the bindings own
 *     __stack_chk_guard (set to a per-boot value before the program runs)
 *     and __stack_chk_fail (a one-line ABORT, status 255);
 *   - thread-local storage blocks: solo5_tls_size, solo5_tls_tp_offset and
 *     solo5_tls_init, over the TLS template solo5_pyvmm.lds lays out;
 *   - the command line: leading --solo5:LEVEL words are the bindings' own
 *     (a log level) and are not passed to the program;
 *   - an interpreter path that does not exist, so running the unikernel as
 *     a host program fails at once instead of executing guest code.
 *
 * Nothing here is privileged; it runs at CPL 0 and CPL 3 alike.
 */
#include "rt_internal.h"

/* Running a unikernel as a Linux program: "No such file or directory". */
__attribute__((section(".interp"), used, aligned(8)))
static const char rt_interp[] = "/nonexistent/solo5-pyvmm/";

/*
 * The guard's value until rt_solo5_start: a recognisable one with a zero
 * low byte, so that a string overrun cannot reproduce it.
 */
uintptr_t __stack_chk_guard = 0x5059564d00c0de00ULL;

void __stack_chk_fail(void) __attribute__((noreturn));
void __stack_chk_fail(void)
{
    /* The program's stack is broken: print from static data only. */
    static const char msg[] =
        "pyvmm-rt: ABORT: stack corruption detected (stack protector)\n";
    solo5_console_write(msg, sizeof(msg) - 1);
    rt_halt(SOLO5_EXIT_ABORT, NULL);
}

void rt_solo5_start(void)
{
    /* A value that differs per boot (the cycle counter at entry, mixed so
     * that all bits change), low byte zero as above.  No stack-protected
     * function is active: only the runtime, built without it, has run. */
    uint64_t x = rt_cycle_counter() * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 32;
    __stack_chk_guard = (uintptr_t)(x & ~0xffULL);
#if !defined(__aarch64__)
    rt_traps_init();
#endif
}

/* ---- the command line ------------------------------------------------- */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
           c == '\v';
}

/* The length of the --solo5:LEVEL word at s, 0 if s starts with none. */
static size_t solo5_option(const char *s)
{
    static const char *const levels[] = {
        "--solo5:quiet", "--solo5:error", "--solo5:warn", "--solo5:info",
        "--solo5:debug",
    };
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
        size_t n = strlen(levels[i]);
        if (strncmp(s, levels[i], n) == 0 && (s[n] == '\0' || is_space(s[n])))
            return n;
    }
    return 0;
}

const char *rt_solo5_cmdline(const char *cmdline)
{
    const char *p = cmdline;
    size_t n;

    while (is_space(*p))
        p++;
    while ((n = solo5_option(p)) != 0) {
        p += n;
        while (is_space(*p))
            p++;
    }
    return p;
}

/* ---- thread-local storage ---------------------------------------------- */

/*
 * solo5_pyvmm.lds lays the TLS template out in read-only data: its first
 * rt_tls_template_size bytes are .tdata's initial values, then zeroes
 * (.tbss and alignment) up to rt_tls_block_size, the size the linker gave
 * the TLS block when it computed each variable's offset.  The sizes are
 * absolute symbols: their addresses are the values.
 */
extern const char rt_tls_template[], rt_tls_template_size[], rt_tls_block_size[];
#define TLS_TEMPLATE ((size_t)(uintptr_t)rt_tls_template_size)
#define TLS_BLOCK ((size_t)(uintptr_t)rt_tls_block_size)

#if defined(__aarch64__)
/* Variant I: the thread pointer points at a 16-byte control block, the
 * TLS data follows it. */
#define TCB_SIZE 16
#else
/* Variant II: the TLS data ends where the thread pointer points, and the
 * first word there holds the thread pointer itself (%fs:0). */
#define TCB_SIZE 8
#endif

size_t solo5_tls_size(void)
{
    return TLS_BLOCK + TCB_SIZE;
}

uintptr_t solo5_tls_tp_offset(uintptr_t tls)
{
#if defined(__aarch64__)
    return tls;
#else
    return tls + TLS_BLOCK;
#endif
}

solo5_result_t solo5_tls_init(uintptr_t tls)
{
    if (tls == 0)
        return SOLO5_R_EINVAL;
#if defined(__aarch64__)
    uint8_t *data = (uint8_t *)(tls + TCB_SIZE);
    memset((void *)tls, 0, TCB_SIZE);
#else
    uint8_t *data = (uint8_t *)tls;
    uintptr_t *tp = (uintptr_t *)solo5_tls_tp_offset(tls);
    *tp = (uintptr_t)tp;
#endif
    memcpy(data, rt_tls_template, TLS_TEMPLATE);
    memset(data + TLS_TEMPLATE, 0, TLS_BLOCK - TLS_TEMPLATE);
    return SOLO5_R_OK;
}

/* ---- the runtime's own heap ---------------------------------------------- */

size_t rt_solo5_runtime_heap(const struct mft *m)
{
    size_t need = 0;
    for (uint32_t i = 0; i < m->entries; i++) {
        if (m->e[i].type == MFT_DEV_NET_BASIC)
            need += ((size_t)m->e[i].u.net_basic.mtu + SOLO5_NET_HLEN + 63) &
                    ~(size_t)63;
    }
    return need;
}

/*
 * Test doubles of the guest runtime that net_shm.c calls (rt_printf, the
 * boot info and manifest, the clock, yield.c's and exit.c's registration)
 * and of the tender (hypercalls, the kick's port write).  See guestnet.h.
 *
 * The kick is net_shm.c's own inline `outl` to SHM_KICK_PIO, which in a
 * Linux process without I/O permission raises #GP (SIGSEGV, SI_KERNEL).
 * The trap here does what KVM's ioeventfd does for the guest: it takes
 * the write (counts it, with its port) and resumes after the instruction,
 * so the tests run the driver's code as the guest has it.  Any other fault
 * goes back to the handler that was there before (pytest's faulthandler).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "guestnet.h"
#include "pyvmm_abi.h"
#include "rt_internal.h"
#include "shmstream.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define PAGE 4096ULL

uint64_t gh_clock_ns, gh_clock_step, gh_clock_reads, gh_clock_last;
void (*gh_clock_hook)(void);
uint64_t gh_polls, gh_first_poll_at, gh_poll_timeout, gh_other_hypercalls;
void (*gh_poll_hook)(void);
uint64_t gh_kicks, gh_stray_io;
uint32_t gh_last_io_port;
uint64_t gh_yield_set_calls;

static struct hvt_boot_info boot_info;
static _Alignas(8) unsigned char manifest[sizeof(struct mft) +
                                          MFT_MAX_ENTRIES * sizeof(struct mft_entry)];
static char console[16384];
static size_t console_len;
static const struct rt_yield_ops *yield_ops;
static void (*exit_hook)(void);
static struct sigaction previous;

/* ---- the runtime ---- */

const struct hvt_boot_info *rt_boot_info(void)
{
    return &boot_info;
}

const struct mft *rt_manifest(void)
{
    return (const struct mft *)manifest;
}

int rt_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(console + console_len, sizeof(console) - console_len, fmt, ap);
    va_end(ap);
    if (n > 0) {
        console_len += (size_t)n;
        if (console_len >= sizeof(console))
            console_len = sizeof(console) - 1;
    }
    return n;
}

solo5_time_t solo5_clock_monotonic(void)
{
    solo5_time_t now = gh_clock_ns;
    gh_clock_last = now;
    gh_clock_reads++;
    gh_clock_ns += gh_clock_step;
    if (gh_clock_hook != NULL)
        gh_clock_hook();
    return now;
}

void rt_yield_set_ops(const struct rt_yield_ops *ops)
{
    yield_ops = ops;
    gh_yield_set_calls++;
}

void rt_set_exit_hook(void (*fn)(void))
{
    exit_hook = fn;
}

/* ---- the tender ---- */

void gh_hypercall(enum hvt_hypercall n, volatile void *arg)
{
    if (n != HVT_HYPERCALL_POLL) {
        gh_other_hypercalls++;
        return;
    }
    volatile struct hvt_hc_poll *p = arg;
    if (gh_polls++ == 0)
        gh_first_poll_at = gh_clock_last;
    gh_poll_timeout = p->timeout_nsecs;
    gh_clock_ns += p->timeout_nsecs;
    p->ready_set = 0;
    p->ret = 0;
    if (gh_poll_hook != NULL)
        gh_poll_hook();
}

static void on_segv(int sig, siginfo_t *si, void *context)
{
    greg_t *reg = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)reg[REG_RIP];

    (void)sig;
    /* #GP at an instruction that was fetched, so ip is readable; 0xef is
     * `out %eax, (%dx)`, one byte. */
    if (si->si_code == SI_KERNEL && ip[0] == 0xef) {
        gh_last_io_port = (uint16_t)reg[REG_RDX];
        if (gh_last_io_port == SHM_KICK_PIO)
            gh_kicks++;
        else
            gh_stray_io++;
        reg[REG_RIP] += 1;
        return;
    }
    /* Not ours: the instruction faults again under the previous handler. */
    sigaction(SIGSEGV, &previous, NULL);
}

static int install_trap(void)
{
    struct sigaction now, ours;

    if (sigaction(SIGSEGV, NULL, &now) != 0)
        return -errno;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_segv)
        return 0;
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = on_segv;
    ours.sa_flags = SA_SIGINFO;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGSEGV, &ours, &previous) != 0)
        return -errno;
    return 0;
}

/* ---- the harness ---- */

static void on_alarm(int sig)
{
    static const char msg[] =
        "testkit._guestnet: a net_shm.c call did not return (watchdog): exiting\n";
    (void)sig;
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(70);
}

int gh_watchdog(unsigned int seconds)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    if (seconds != 0 && sigaction(SIGALRM, &sa, NULL) != 0)
        return -errno;
    alarm(seconds);
    return 0;
}

struct pyvmm_boot_ext *gh_boot_ext(void)
{
    return (struct pyvmm_boot_ext *)(uintptr_t)PYVMM_BOOT_EXT_GPA;
}

static int map_boot_ext_page(void)
{
    static int mapped;
    void *page = (void *)(uintptr_t)(PYVMM_BOOT_EXT_GPA & ~(PAGE - 1));

    if (!mapped) {
        void *got = mmap(page, PAGE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (got == MAP_FAILED)
            return -errno;
        if (got != page) {   /* a kernel without MAP_FIXED_NOREPLACE: a hint */
            munmap(got, PAGE);
            return -EEXIST;
        }
        mapped = 1;
    }
    memset(page, 0, PAGE);
    return 0;
}

int gh_reset(void)
{
    int err = map_boot_ext_page();
    if (err == 0)
        err = install_trap();
    memset(&boot_info, 0, sizeof(boot_info));
    memset(manifest, 0, sizeof(manifest));
    console[0] = '\0';
    console_len = 0;
    gh_clock_ns = gh_clock_step = gh_clock_reads = gh_clock_last = 0;
    gh_clock_hook = NULL;
    gh_polls = gh_first_poll_at = gh_poll_timeout = gh_other_hypercalls = 0;
    gh_poll_hook = NULL;
    gh_kicks = gh_stray_io = 0;
    gh_last_io_port = 0;
    gh_yield_set_calls = 0;
    yield_ops = NULL;
    exit_hook = NULL;
    gh_netshm_reset();
    return err;
}

void *gh_map_low(uint64_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *gh_map_fixed(uint64_t addr, uint64_t size)
{
    void *want = (void *)(uintptr_t)addr;
    void *p = mmap(want, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (p != want) {
        munmap(p, size);
        return NULL;
    }
    return p;
}

int gh_unmap(void *addr, uint64_t size)
{
    return munmap(addr, size) == 0 ? 0 : -errno;
}

struct hvt_boot_info *gh_boot_info(void)
{
    return &boot_info;
}

struct mft *gh_manifest(void)
{
    return (struct mft *)manifest;
}

const char *gh_console(void)
{
    return console;
}

uint64_t gh_yield_served(void)
{
    return yield_ops ? yield_ops->served : 0;
}

uint64_t gh_yield_others(void)
{
    return yield_ops ? yield_ops->others : 0;
}

int64_t gh_yield_ready(void)
{
    return yield_ops && yield_ops->ready ? (int64_t)yield_ops->ready() : -1;
}

int gh_yield_prepare_sleep(void)
{
    return yield_ops && yield_ops->prepare_sleep ? yield_ops->prepare_sleep() : -1;
}

int gh_yield_awake(void)
{
    if (!yield_ops || !yield_ops->awake)
        return -1;
    yield_ops->awake();
    return 0;
}

int gh_run_exit_hook(void)
{
    if (exit_hook == NULL)
        return 0;
    exit_hook();
    return 1;
}

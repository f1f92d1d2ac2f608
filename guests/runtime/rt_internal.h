/*
 * Runtime internals shared between runtime files; programs do not include it.
 */
#ifndef RT_INTERNAL_H
#define RT_INTERNAL_H

#include "rt.h"

/* init.c */
void rt_init(const struct hvt_boot_info *bi) __attribute__((noreturn));
/* The manifest entry (handle) if it exists and has (type), else NULL. */
const struct mft_entry *rt_mft_entry(solo5_handle_t handle, uint32_t type);
/* Acquire the attached device (name) of (type) once: its handle, or
 * SOLO5_R_EINVAL if it is missing, unattached or already acquired. */
solo5_result_t rt_mft_acquire(const char *name, uint32_t type,
        solo5_handle_t *handle, const struct mft_entry **entry);

/* platform.c: every privileged CPU setup goes here and only here, so it can
 * be skipped when the runtime runs at CPL 3. */
void rt_platform_setup(const struct hvt_boot_info *bi);

/* clock.c */
void rt_clock_init(const struct hvt_boot_info *bi);

/* heap.c */
void rt_heap_init(uintptr_t start, uintptr_t end);

/* exit.c: halt hypercall with an optional abort cookie. */
void rt_halt(int status, void *cookie) __attribute__((noreturn));
/* exit.c: run (fn) in solo5_exit before halting (not in solo5_abort); the
 * shmstream driver waits there until the host has sent every queued frame. */
void rt_set_exit_hook(void (*fn)(void));

/*
 * Device drivers.  The Solo5 net and block calls check the handle and the
 * arguments, then go through one of these, so a driver that does not use a
 * hypercall per frame (the shmstream rings) can replace the hypercall one
 * for a device without touching the API code.  A driver's calls receive
 * checked arguments: a valid, attached handle of the right type and a size
 * within the device's limits.
 */
struct rt_net_driver {
    const char *name;
    int shm;               /* 1: frames go through shared-memory rings */
    /* solo5_net_write: send one frame now (waiting briefly for space). */
    solo5_result_t (*write)(solo5_handle_t h, const uint8_t *buf, size_t size);
    solo5_result_t (*read)(solo5_handle_t h, uint8_t *buf, size_t size,
            size_t *read_size);
    /* pyvmm_net_read_zc / _read_done, both NULL if the back end has no
     * frames in memory to lend (net.c then reads into a buffer). */
    solo5_result_t (*read_zc)(solo5_handle_t h, uint8_t **frame, size_t *len);
    void (*read_done)(solo5_handle_t h);
    /* pyvmm_net_queue / _flush / _tx_wait / _stats; all but queue may be
     * NULL (nothing to do). */
    solo5_result_t (*queue)(solo5_handle_t h, const uint8_t *buf, size_t size);
    void (*flush)(solo5_handle_t h);
    solo5_result_t (*tx_wait)(solo5_handle_t h);
    void (*stats)(solo5_handle_t h, struct pyvmm_net_stats *out);
};

struct rt_block_driver {
    const char *name;
    solo5_result_t (*write)(solo5_handle_t h, solo5_off_t offset,
            const uint8_t *buf, size_t size);
    solo5_result_t (*read)(solo5_handle_t h, solo5_off_t offset,
            uint8_t *buf, size_t size);
};

extern const struct rt_net_driver rt_net_hvt_driver;     /* net_hvt.c */
extern const struct rt_block_driver rt_block_hvt_driver; /* block_hvt.c */

/* Choose the driver for one net device (default: rt_net_hvt_driver). */
void rt_net_set_driver(solo5_handle_t h, const struct rt_net_driver *drv);

/*
 * net_shm.c: called by solo5_net_acquire for every net device acquired.
 * Validates pyvmm's shmstream region (once) and returns its driver if the
 * region serves device (h), else NULL (the hypercall driver is used).
 */
const struct rt_net_driver *rt_net_shm_probe(solo5_handle_t h,
        const struct mft_entry *e);

/*
 * yield.c: a net back end whose input solo5_yield cannot learn from the
 * poll hypercall alone (frames already sitting in memory) registers these.
 * With none registered solo5_yield is the plain poll hypercall.
 */
struct rt_yield_ops {
    /* Handles with input waiting, found without an exit. */
    solo5_handle_set_t (*ready)(void);
    /* About to block in the poll hypercall: tell the producers.  0 if
     * input arrived meanwhile (then nothing stays announced). */
    int (*prepare_sleep)(void);
    /* Back from the poll hypercall. */
    void (*awake)(void);
    /* The handles whose readiness ready() decides; bits of the hypercall's
     * ready_set for them are ignored. */
    solo5_handle_set_t served;
    /* Acquired net devices not served: with none, a yield to a deadline
     * already passed needs no hypercall at all. */
    solo5_handle_set_t others;
};
void rt_yield_set_ops(const struct rt_yield_ops *ops);

/* The cycle counter: the TSC on x86_64, the generic timer's virtual count
 * on aarch64 (its frequency is hvt_boot_info.cpu_cycle_freq). */
static inline uint64_t rt_cycle_counter(void)
{
#if defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(v) : : "memory");
    return v;
#else
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#endif
}

/*
 * Built as Solo5 bindings (solo5_pyvmm.o, RT_SOLO5_BINDINGS):
 * solo5_bindings.c and traps.c.
 */
/* First thing at entry: the stack protector's guard, CPL 0 trap handlers. */
void rt_solo5_start(void);
/* The command line without the bindings' own leading --solo5:LEVEL words. */
const char *rt_solo5_cmdline(const char *cmdline);
/* x86_64 at CPL 0: an IDT whose handlers report a trap and abort. */
void rt_traps_init(void);
/* The heap the runtime keeps for itself (the zero-copy read's buffers on
 * the hypercall path, one frame per net device), below the program's: a
 * Solo5 program owns all of the heap it is given. */
size_t rt_solo5_runtime_heap(const struct mft *m);

#endif

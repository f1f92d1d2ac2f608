/*
 * testkit._guestnet: guests/runtime/net_shm.c compiled for the host, with
 * test doubles of what it needs from the guest runtime (doubles.c) and
 * entry points into its driver (netshm_harness.c).  The tests play the
 * host: they write the boot extension, the region and the rings, and call
 * the driver as net.c would.  Written so cffi's cdef parser reads it.
 */
#ifndef TESTKIT_GUESTNET_H
#define TESTKIT_GUESTNET_H

#include <stddef.h>
#include <stdint.h>

struct hvt_boot_info;
struct mft;
struct pyvmm_boot_ext;
struct pyvmm_net_stats;

/* ---- doubles.c: the runtime and the tender ---- */

/* Fresh state for one test: every double and net_shm.c's own statics
 * zeroed, the boot extension page mapped (at its GPA) and zeroed, the kick
 * trap installed.  0, or -errno if the page cannot be mapped. */
int gh_reset(void);

/* A driver call that never returns (a loop that no longer ends) would
 * hang the test run: after (seconds) the process says so on stderr and
 * exits with status 70.  0 cancels it. */
int gh_watchdog(unsigned int seconds);

/* Memory below 4 GiB (the guest's identity map), page aligned: a region. */
void *gh_map_low(uint64_t size);
/* Memory at exactly (addr), or NULL if anything is mapped there. */
void *gh_map_fixed(uint64_t addr, uint64_t size);
int gh_unmap(void *addr, uint64_t size);

/* The boot extension, at PYVMM_BOOT_EXT_GPA. */
struct pyvmm_boot_ext *gh_boot_ext(void);
/* What rt_boot_info() and rt_manifest() return (the manifest has room for
 * MFT_MAX_ENTRIES entries). */
struct hvt_boot_info *gh_boot_info(void);
struct mft *gh_manifest(void);

/* rt_printf's output since the last reset. */
const char *gh_console(void);

/* solo5_clock_monotonic: returns gh_clock_ns, then adds gh_clock_step,
 * then runs gh_clock_hook (if set): the host acting between two of the
 * driver's looks at the clock and at the ring. */
extern uint64_t gh_clock_ns;
extern uint64_t gh_clock_step;
extern uint64_t gh_clock_reads;
extern uint64_t gh_clock_last;      /* the value the last read returned */
extern void (*gh_clock_hook)(void);

/* HVT_HYPERCALL_POLL: counted, its timeout added to the clock, then
 * gh_poll_hook (if set) runs: the host acting while the guest waits. */
extern uint64_t gh_polls;
extern uint64_t gh_first_poll_at;   /* gh_clock_last at the first poll */
extern uint64_t gh_poll_timeout;    /* the last poll's timeout_nsecs */
extern void (*gh_poll_hook)(void);
/* Any other hypercall (net_shm.c makes none). */
extern uint64_t gh_other_hypercalls;

/* Port output (outl %eax, %dx) trapped and skipped: kicks to SHM_KICK_PIO,
 * and any other port. */
extern uint64_t gh_kicks;
extern uint64_t gh_stray_io;
extern uint32_t gh_last_io_port;

/* What the driver registered with yield.c and exit.c. */
extern uint64_t gh_yield_set_calls;
uint64_t gh_yield_served(void);
uint64_t gh_yield_others(void);
/* ready(), prepare_sleep() and awake() of the registered ops; -1 if the
 * ops or the hook are not set. */
int64_t gh_yield_ready(void);
int gh_yield_prepare_sleep(void);
int gh_yield_awake(void);
/* Run the exit hook as solo5_exit would: 1 if one was set, else 0. */
int gh_run_exit_hook(void);

/* ---- netshm_harness.c: the driver ---- */

/* rt_net_shm_probe(h, &manifest entry h): 1 if it returned the shmstream
 * driver, 0 if NULL, -1 for any other pointer. */
int gh_probe(uint64_t h);
/* The driver's name and its shm flag. */
const char *gh_driver_name(void);
int gh_driver_shm(void);
/* Its operations, called as net.c calls them (solo5_result_t as int). */
int gh_write(uint64_t h, const uint8_t *buf, size_t size);
int gh_read(uint64_t h, uint8_t *buf, size_t size, size_t *read_size);
int gh_read_zc(uint64_t h, uint8_t **frame, size_t *len);
void gh_read_done(uint64_t h);
int gh_queue(uint64_t h, const uint8_t *buf, size_t size);
void gh_flush(uint64_t h);
int gh_tx_wait(uint64_t h);
void gh_stats(uint64_t h, struct pyvmm_net_stats *out);

/* net_shm.c's statics back to their load-time zeros (gh_reset calls it). */
void gh_netshm_reset(void);

#endif

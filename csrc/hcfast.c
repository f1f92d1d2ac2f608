/* See hcfast.h: the per-frame hvt hypercalls, answered without Python. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/kvm.h>

#include "arch.h"
#include "fdwait.h"
#include "guard.h"
#include "hcfast.h"
#include "hvt_abi.h"
#include "iothread.h"
#include "kvm_run.h"
#include "signals.h"
#include "spin.h"
#include "static_check.h"
#include "tap_io.h"

_Static_assert(sizeof(struct hvt_hc_block_read) == sizeof(struct hvt_hc_block_write) &&
               offsetof(struct hvt_hc_block_read, ret) ==
               offsetof(struct hvt_hc_block_write, ret),
               "block_io reads both requests through one layout");
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, net_fd, MFT_MAX_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, max_frame, MFT_MAX_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, blk_fd, MFT_MAX_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, blk_capacity, MFT_MAX_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, blk_block_size, MFT_MAX_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, poll_fd, PYVMM_FAST_MAX_POLL);
PYVMM_ARRAY_LEN_IS(struct pyvmm_fastpath, poll_handle, PYVMM_FAST_MAX_POLL);
_Static_assert(PYVMM_FAST_MAX_POLL == PYVMM_WAIT_MAX_FDS, "one poll-set limit (fdwait.h)");
/* The manifest's handles and hvt's ABI facts, for every header cffi reads
 * with hand-sized arrays. */
PYVMM_ARRAY_LEN_IS(struct mft_entry, name, MFT_NAME_SIZE);

enum { ANSWERED, PYTHON };

/*
 * Wake-up moderation of poll with a shmstream region: the guest polls only
 * once its RX rings are empty, so an immediate answer hands it a frame or
 * two and it polls (exits) again at once.  Sleeping this long first (never
 * when the guest's own timeout is shorter, ended early by a stop signal)
 * gives it a batch per exit.  Measured with bench/pps.py and the
 * 30000-frame flood of tests/test_shmstream.py (event mode): without it,
 * answering in C cost 1.5-4x the exits per frame of Python's answer (which
 * took about this long by itself); spinning instead of sleeping took the
 * CPU the IO thread needed; asleep, exits per frame and vCPU time came out
 * below Python's.
 */
#define POLL_COALESCE_NS 50000
/*
 * ...but not for sparse traffic: when this wait and the one before both
 * blocked this long or longer, frames come one at a time (requests, pings)
 * and the moderation would only add its 50 us to every round trip, saving
 * no exit (bench/pps.py's latency rows, docs/modes.md).  A stream keeps
 * its batches, also across one pause of the sender.
 */
#define POLL_IDLE_NS 200000

/* The host address of [gpa, gpa + len) for access PYVMM_GM_*, or NULL. */
static uint8_t *guest(const struct pyvmm_fastpath *fp, uint64_t gpa, uint64_t len, int access)
{
    return pyvmm_guestmem_at(fp->mem, gpa, len, access);
}

/* Copy the struct in once (the guest may change it), and write back only
 * the result fields, as Python does: a buffer that overlaps the struct
 * keeps what was read into it. Under answer()'s guard. */
#define LOAD_ARG(fp, gpa, arg, at)                                       \
    do {                                                                 \
        if (!((at) = guest(fp, gpa, sizeof(arg), PYVMM_GM_WRITE)))       \
            return PYTHON;                                               \
        memcpy(&(arg), at, sizeof(arg));                                 \
    } while (0)
#define STORE(at, arg, field) \
    memcpy((at) + offsetof(__typeof__(arg), field), &(arg).field, sizeof((arg).field))

static int net_fd(const struct pyvmm_fastpath *fp, uint64_t handle)
{
    return handle < MFT_MAX_ENTRIES ? fp->net_fd[handle] : -1;
}

static int walltime(struct pyvmm_fastpath *fp, uint64_t gpa)
{
    struct hvt_hc_walltime arg;
    uint8_t *at;

    LOAD_ARG(fp, gpa, arg, at);
    arg.nsecs = clock_ns(CLOCK_REALTIME);
    STORE(at, arg, nsecs);
    fp->walltimes++;
    return ANSWERED;
}

/* As TapBackend.read_into (both are tap_io_read): one frame, or AGAIN; a
 * frame longer than the guest's buffer is dropped and counted, never
 * handed over cut short. */
static int net_read(struct pyvmm_fastpath *fp, uint64_t gpa)
{
    const struct tap_io_tally rx = {
        .frames = &fp->net_reads,
        .again = &fp->net_reads_again,
        .oversize = &fp->rx_dropped,
    };
    struct hvt_hc_net_read arg;
    uint8_t *at, *buf;
    uint32_t len = 0;
    int fd;

    LOAD_ARG(fp, gpa, arg, at);
    fd = net_fd(fp, arg.handle);
    if (fd < 0 || arg.len > UINT32_MAX || !(buf = guest(fp, arg.data, arg.len, PYVMM_GM_WRITE)))
        return PYTHON;
    switch (tap_io_read(fd, buf, (uint32_t)arg.len, &len, &rx)) {
    case TAP_IO_FRAME:
        arg.len = len;
        arg.ret = HVT_RET_OK;
        STORE(at, arg, len);
        break;
    case TAP_IO_AGAIN:
        arg.ret = HVT_RET_AGAIN;
        break;
    default:
        arg.ret = HVT_RET_EUNSPEC;
        break;
    }
    STORE(at, arg, ret);
    return ANSWERED;
}

/* As TapBackend.write (both are tap_io_write): a frame the tap cannot take
 * or a runt is dropped and counted (the guest's stack retransmits); a
 * frame too big is Python's EINVAL. */
static int net_write(struct pyvmm_fastpath *fp, uint64_t gpa)
{
    const struct tap_io_tally tx = { .frames = &fp->net_writes, .failed = &fp->tx_dropped };
    struct hvt_hc_net_write arg;
    uint8_t *at, *buf;
    int fd;

    LOAD_ARG(fp, gpa, arg, at);
    fd = net_fd(fp, arg.handle);
    if (fd < 0 || arg.len > fp->max_frame[arg.handle] ||
        !(buf = guest(fp, arg.data, arg.len, PYVMM_GM_READ)))
        return PYTHON;
    arg.ret = tap_io_write(fd, buf, (uint32_t)arg.len, HVT_ETH_HLEN, &tx) == TAP_IO_FAILED
                  ? HVT_RET_EUNSPEC
                  : HVT_RET_OK;
    STORE(at, arg, ret);
    return ANSWERED;
}

/* As Hypercalls._block: whole blocks inside the disk, all or nothing.  A
 * request that is not (Python's EINVAL) or a buffer the view refuses (its
 * fault) goes to Python; I/O errors and a file that shrank are EUNSPEC. */
static int block_io(struct pyvmm_fastpath *fp, uint64_t gpa, int is_read)
{
    struct hvt_hc_block_read arg;   /* block_write has the same layout */
    uint64_t bs, done = 0;
    uint8_t *at, *buf;
    int fd;

    LOAD_ARG(fp, gpa, arg, at);
    if (arg.handle >= MFT_MAX_ENTRIES || (fd = fp->blk_fd[arg.handle]) < 0)
        return PYTHON;
    bs = fp->blk_block_size[arg.handle];
    if (bs == 0 || arg.len == 0 || arg.offset % bs || arg.len % bs ||
        arg.offset > fp->blk_capacity[arg.handle] ||
        arg.len > fp->blk_capacity[arg.handle] - arg.offset)
        return PYTHON;
    if (!(buf = guest(fp, arg.data, arg.len, is_read ? PYVMM_GM_WRITE : PYVMM_GM_READ)))
        return PYTHON;
    arg.ret = HVT_RET_OK;
    while (done < arg.len) {
        ssize_t n = is_read ? pread(fd, buf + done, arg.len - done, (off_t)(arg.offset + done))
                            : pwrite(fd, buf + done, arg.len - done, (off_t)(arg.offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            arg.ret = HVT_RET_EUNSPEC;
            break;
        }
        done += (uint64_t)n;
    }
    if (is_read)
        fp->block_reads++;
    else
        fp->block_writes++;
    STORE(at, arg, ret);
    return ANSWERED;
}

/* As Hypercalls.poll.  With a shmstream region: re-arm the IO thread's
 * wake-up and clear a stale one before looking at the RX rings (a frame
 * published after the look signals the wake eventfd, which the wait
 * watches), and look again after the wait and the moderation window.  -EINTR: answered with what is ready, and the caller
 * returns so Python sees the signal. */
static int poll_hc(struct pyvmm_fastpath *fp, uint64_t gpa, int *interrupted)
{
    struct hvt_hc_poll arg;
    uint64_t ready = 0, mask[PYVMM_WAIT_MASK_WORDS] = { 0 }, waited;
    int64_t timeout;
    uint8_t *at;
    int r, sparse;
    uint32_t i, n = fp->n_poll < PYVMM_FAST_MAX_POLL ? fp->n_poll : PYVMM_FAST_MAX_POLL;

    LOAD_ARG(fp, gpa, arg, at);
    timeout = arg.timeout_nsecs > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)arg.timeout_nsecs;
    if (fp->shm) {
        shm_poll_drain_wake(fp->shm);
        ready = shm_poll_ready_set(fp->shm);
        if (ready)
            timeout = 0;
    }
    waited = clock_ns(CLOCK_MONOTONIC);
    r = pyvmm_poll_until(fp->poll_fd, (int)n, timeout, mask);
    waited = clock_ns(CLOCK_MONOTONIC) - waited;
    if (r < 0 && r != -EINTR)
        return PYTHON;   /* Python waits again and reports the failure */
    if (r == -EINTR)
        *interrupted = 1;
    sparse = fp->poll_idle && waited >= POLL_IDLE_NS;
    fp->poll_idle = waited >= POLL_IDLE_NS;
    if (fp->shm && !*interrupted && arg.timeout_nsecs >= POLL_COALESCE_NS && !sparse) {
        /* Asleep, not spinning: the IO thread needs the CPU to fill the
         * rings.  Only the stop eventfd (poll_fd[0]) ends it early. */
        uint64_t stop;
        if (pyvmm_wait_readable(fp->poll_fd, 1, POLL_COALESCE_NS, &stop) == -EINTR)
            *interrupted = 1;
    }
    if (fp->shm)
        ready |= shm_poll_ready_set(fp->shm);
    for (i = 0; r > 0 && i < n; i++)
        if ((mask[i / 64] >> (i % 64) & 1) && fp->poll_handle[i] >= 0)
            ready |= (uint64_t)1 << fp->poll_handle[i];
    arg.ready_set = ready;
    arg.ret = HVT_RET_OK;
    STORE(at, arg, ready_set);
    STORE(at, arg, ret);
    fp->polls++;
    return ANSWERED;
}

static int dispatch(struct pyvmm_fastpath *fp, const struct pyvmm_exit *exit, int *interrupted)
{
    uint64_t gpa;

    /* A kick of Solo5's ring this thread serves (its own guard: memory
     * lost under the ring goes to Python, which says so). */
    if (fp->ring_io && pyvmm_arch_doorbell(exit) == HVT_RING_KICK_PIO) {
        return io_solo5_kick(fp->ring_io) < 0 ? PYTHON : ANSWERED;
    }

    /* The transport is the architecture's (arch.h): port I/O or MMIO. */
    switch (pyvmm_arch_hypercall(exit, &gpa)) {
    case HVT_HYPERCALL_WALLTIME:
        return walltime(fp, gpa);
    case HVT_HYPERCALL_NET_READ:
        return net_read(fp, gpa);
    case HVT_HYPERCALL_NET_WRITE:
        return net_write(fp, gpa);
    case HVT_HYPERCALL_POLL:
        return poll_hc(fp, gpa, interrupted);
    case HVT_HYPERCALL_BLOCK_READ:
        return block_io(fp, gpa, 1);
    case HVT_HYPERCALL_BLOCK_WRITE:
        return block_io(fp, gpa, 0);
    default:
        return PYTHON;
    }
}

/*
 * Every load and store of guest memory in an answer is under one guard
 * (guard.h): guest memory mapped from a file (a restored snapshot's, all
 * of it) can lose a page under them, and the SIGBUS that raises comes
 * back here. The hypercall then goes to Python, whose guarded copies end
 * the run with the fault in one line. One sigsetjmp per exit: about 12 ns
 * beside the exit's microseconds.
 */
static int answer(struct pyvmm_fastpath *fp, const struct pyvmm_exit *exit, int *interrupted)
{
    struct pyvmm_guard g;
    int r;

    if (sigsetjmp(g.env, 0))
        return PYTHON;
    pyvmm_guard_enter(&g, (const void *)(uintptr_t)fp->mem->host, fp->mem->size, NULL, 0);
    r = dispatch(fp, exit, interrupted);
    pyvmm_guard_leave(&g);
    return r;
}

int pyvmm_vcpu_run_fast(int vcpu_fd, void *kvm_run, struct pyvmm_exit *exit,
                        struct pyvmm_fastpath *fp)
{
    for (;;) {
        int interrupted = 0;
        int r = pyvmm_vcpu_run(vcpu_fd, kvm_run, exit);
        if (r < 0)
            return r;
        if (answer(fp, exit, &interrupted) == PYTHON)
            return 0;
        fp->answered++;
        if (interrupted || pyvmm_stop_signal())
            return -EINTR;
    }
}

/* See tap_io.h: tap frame I/O and its drop policy, written once. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tap_io.h"

static void bump(uint64_t *counter, uint64_t by)
{
    if (counter)
        *counter += by;
}

static int failed(const struct tap_io_tally *t)
{
    if (t)
        bump(t->errors, 1);
    return TAP_IO_FAILED;
}

void tap_io_count_frame(const struct tap_io_tally *t, uint32_t len)
{
    if (!t)
        return;
    bump(t->frames, 1);
    bump(t->bytes, len);
}

int tap_io_read_one(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t)
{
    uint8_t overflow;
    struct iovec iov[2] = { { buf, size }, { &overflow, 1 } };
    ssize_t n;

    do
        n = readv(fd, iov, 2);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (t)
            bump(t->again, 1);
        return TAP_IO_AGAIN;
    }
    if (n < 0)
        return failed(t);
    if ((uint64_t)n > size) {
        if (t)
            bump(t->oversize, 1);
        return TAP_IO_OVERSIZE;
    }
    *len = (uint32_t)n;
    tap_io_count_frame(t, (uint32_t)n);
    return TAP_IO_FRAME;
}

int tap_io_read(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t)
{
    int drops = 0, r;

    while ((r = tap_io_read_one(fd, buf, size, len, t)) == TAP_IO_OVERSIZE)
        if (++drops >= TAP_IO_TURN) {
            if (t)
                bump(t->again, 1);
            return TAP_IO_AGAIN;
        }
    return r;
}

/* A tap that cannot take a frame now: its queue is full (EAGAIN,
 * ENOBUFS), its link is down (EIO), or it refuses the frame (EINVAL). */
static int is_drop(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == EIO || err == EINVAL;
}

int tap_io_write(int fd, const void *buf, uint32_t len, uint32_t min_len,
                 const struct tap_io_tally *t)
{
    ssize_t n = 0;

    if (len >= min_len) {
        do
            n = write(fd, buf, len);
        while (n < 0 && errno == EINTR);
    }
    if (len < min_len || (n < 0 && is_drop(errno))) {
        if (t)
            bump(t->failed, 1);
        return TAP_IO_DROPPED;
    }
    if (n < 0)
        return failed(t);
    tap_io_count_frame(t, len);
    return TAP_IO_FRAME;
}

/*
 * io_uring, through its raw interface (no liburing: three system calls and
 * two shared rings).  COOP_TASKRUN: a frame's arrival never interrupts the
 * thread (no IPI); the reads that became ready run at its next system
 * call, and TASKRUN_FLAG tells it, in the shared SQ flags, that one is due.
 */
struct tap_uring {
    int fd;
    uint32_t ntaps;
    void *rings;            /* SQ and CQ rings, one mapping (FEAT_SINGLE_MMAP) */
    size_t rings_size;
    struct io_uring_sqe *sqes;
    size_t sqes_size;
    uint32_t *sq_tail, *sq_flags, *sq_array, sq_mask;
    uint32_t *cq_head, *cq_tail, cq_mask;
    struct io_uring_cqe *cqes;
    uint32_t queued;        /* SQEs written, not yet taken by the kernel */
    uint32_t inflight[TAP_URING_MAX_TAPS];
    uint8_t overflow;       /* every read's second iovec: never read back */
    struct iovec iov[TAP_URING_MAX_TAPS][TAP_URING_CHAIN][2];
};

static long uring_setup(unsigned entries, struct io_uring_params *p)
{
    return syscall(__NR_io_uring_setup, entries, p);
}

static long uring_enter(int fd, unsigned submit, unsigned min, unsigned flags)
{
    return syscall(__NR_io_uring_enter, fd, submit, min, flags, NULL, 0);
}

static long uring_register(int fd, unsigned op, void *arg, unsigned n)
{
    return syscall(__NR_io_uring_register, fd, op, arg, n);
}

/* READV on registered files only, hard links allowed, and after enabling
 * no registration but the cancel of its own reads. */
static int restrict_ring(int fd)
{
    struct io_uring_restriction r[4];

    memset(r, 0, sizeof(r));
    r[0].opcode = IORING_RESTRICTION_SQE_OP;
    r[0].sqe_op = IORING_OP_READV;
    r[1].opcode = IORING_RESTRICTION_SQE_FLAGS_REQUIRED;
    r[1].sqe_flags = IOSQE_FIXED_FILE;
    r[2].opcode = IORING_RESTRICTION_SQE_FLAGS_ALLOWED;
    r[2].sqe_flags = IOSQE_IO_HARDLINK;
    r[3].opcode = IORING_RESTRICTION_REGISTER_OP;
    r[3].register_op = IORING_REGISTER_SYNC_CANCEL;
    return uring_register(fd, IORING_REGISTER_RESTRICTIONS, r, 4) < 0 ? -errno : 0;
}

static int map_rings(struct tap_uring *u, const struct io_uring_params *p)
{
    size_t sq = p->sq_off.array + p->sq_entries * sizeof(uint32_t);
    size_t cq = p->cq_off.cqes + p->cq_entries * sizeof(struct io_uring_cqe);
    char *base;

    if (!(p->features & IORING_FEAT_SINGLE_MMAP) || !(p->features & IORING_FEAT_NODROP))
        return -EINVAL;
    u->rings_size = sq > cq ? sq : cq;
    base = mmap(NULL, u->rings_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                IORING_OFF_SQ_RING);
    if (base == MAP_FAILED)
        return -errno;
    u->rings = base;
    u->sqes_size = p->sq_entries * sizeof(struct io_uring_sqe);
    u->sqes = mmap(NULL, u->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                   IORING_OFF_SQES);
    if (u->sqes == MAP_FAILED) {
        u->sqes = NULL;
        return -errno;
    }
    u->sq_tail = (uint32_t *)(base + p->sq_off.tail);
    u->sq_flags = (uint32_t *)(base + p->sq_off.flags);
    u->sq_array = (uint32_t *)(base + p->sq_off.array);
    u->sq_mask = *(uint32_t *)(base + p->sq_off.ring_mask);
    u->cq_head = (uint32_t *)(base + p->cq_off.head);
    u->cq_tail = (uint32_t *)(base + p->cq_off.tail);
    u->cq_mask = *(uint32_t *)(base + p->cq_off.ring_mask);
    u->cqes = (struct io_uring_cqe *)(base + p->cq_off.cqes);
    return 0;
}

static void unmap_and_close(struct tap_uring *u)
{
    if (u->sqes)
        munmap(u->sqes, u->sqes_size);
    if (u->rings)
        munmap(u->rings, u->rings_size);
    if (u->fd >= 0)
        close(u->fd);
    free(u);
}

int tap_uring_open(const int *fds, uint32_t n, struct tap_uring **out)
{
    struct io_uring_params p;
    struct tap_uring *u;
    long fd;
    int err;

    if (n == 0 || n > TAP_URING_MAX_TAPS)
        return -EINVAL;
    if (!(u = calloc(1, sizeof(*u))))
        return -ENOMEM;
    u->fd = -1;
    u->ntaps = n;
    memset(&p, 0, sizeof(p));
    /* The CQ is twice the SQ: all of it in flight never overflows it. */
    p.flags = IORING_SETUP_R_DISABLED | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
              IORING_SETUP_TASKRUN_FLAG | IORING_SETUP_CLAMP;
    fd = uring_setup(n * TAP_URING_CHAIN, &p);
    if (fd < 0) {
        err = -errno;
        free(u);
        return err;
    }
    u->fd = (int)fd;
    if (p.sq_entries < n * TAP_URING_CHAIN)
        err = -EINVAL;
    else if (!(err = map_rings(u, &p)) && !(err = restrict_ring(u->fd)) &&
             uring_register(u->fd, IORING_REGISTER_FILES, (void *)fds, n) < 0)
        err = -errno;
    if (!err && uring_register(u->fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0) < 0)
        err = -errno;
    if (err) {
        unmap_and_close(u);
        return err;
    }
    *out = u;
    return 0;
}

int tap_uring_fd(const struct tap_uring *u)
{
    return u->fd;
}

uint32_t tap_uring_inflight(const struct tap_uring *u, uint32_t tap)
{
    return tap < u->ntaps ? u->inflight[tap] : 0;
}

int tap_uring_read_chain(struct tap_uring *u, uint32_t tap, void *const *bufs,
                         const uint32_t *tags, uint32_t n, uint32_t size)
{
    uint32_t tail = *u->sq_tail, i;

    if (tap >= u->ntaps || n == 0 || n > TAP_URING_CHAIN)
        return -EINVAL;
    if (u->inflight[tap])
        return -EBUSY;
    for (i = 0; i < n; i++) {
        uint32_t idx = (tail + i) & u->sq_mask;
        struct io_uring_sqe *sqe = &u->sqes[idx];
        struct iovec *iov = u->iov[tap][i];

        iov[0].iov_base = bufs[i];
        iov[0].iov_len = size;
        iov[1].iov_base = &u->overflow;
        iov[1].iov_len = 1;
        memset(sqe, 0, sizeof(*sqe));
        sqe->opcode = IORING_OP_READV;
        sqe->fd = (int32_t)tap; /* its index among the registered files */
        sqe->flags = IOSQE_FIXED_FILE | (i + 1 < n ? IOSQE_IO_HARDLINK : 0);
        sqe->addr = (uint64_t)(uintptr_t)iov;
        sqe->len = 2;
        sqe->off = (uint64_t)-1;
        sqe->user_data = (uint64_t)tap << 32 | tags[i];
        u->sq_array[idx] = idx;
    }
    __atomic_store_n(u->sq_tail, tail + n, __ATOMIC_RELEASE);
    u->queued += n;
    u->inflight[tap] = n;
    return 0;
}

static int work_due(const struct tap_uring *u)
{
    return (__atomic_load_n(u->sq_flags, __ATOMIC_RELAXED) &
            (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0;
}

int tap_uring_kick(struct tap_uring *u)
{
    long n;

    if (!u->queued && !work_due(u))
        return 0;
    do
        n = uring_enter(u->fd, u->queued, 0, IORING_ENTER_GETEVENTS);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    u->queued -= (uint32_t)n < u->queued ? (uint32_t)n : u->queued;
    return 0;
}

int tap_uring_ready(const struct tap_uring *u)
{
    return *u->cq_head != __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE) || work_due(u);
}

int tap_uring_reap(struct tap_uring *u, uint32_t *tap, uint32_t *tag, int32_t *res)
{
    uint32_t head = *u->cq_head;
    const struct io_uring_cqe *cqe;

    if (head == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE))
        return 0;
    cqe = &u->cqes[head & u->cq_mask];
    *tap = (uint32_t)(cqe->user_data >> 32);
    *tag = (uint32_t)cqe->user_data;
    *res = cqe->res;
    __atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
    if (*tap < u->ntaps && u->inflight[*tap])
        u->inflight[*tap]--;
    return 1;
}

static uint32_t total_inflight(const struct tap_uring *u)
{
    uint32_t i, sum = 0;

    for (i = 0; i < u->ntaps; i++)
        sum += u->inflight[i];
    return sum;
}

/* A hard-linked chain goes on past a cancelled read: its next read is
 * issued and waits in turn, so cancel until none is left (bounded: one
 * round per read of the longest chain, and a few more). */
void tap_uring_cancel(struct tap_uring *u)
{
    struct io_uring_sync_cancel_reg cancel;
    uint32_t tap, tag;
    int32_t res;
    int round;

    for (round = 0; round < TAP_URING_CHAIN + 4 && total_inflight(u); round++) {
        memset(&cancel, 0, sizeof(cancel));
        cancel.fd = -1;
        cancel.flags = IORING_ASYNC_CANCEL_ANY | IORING_ASYNC_CANCEL_ALL;
        cancel.timeout.tv_sec = 1;
        cancel.timeout.tv_nsec = 0;
        if (u->queued)
            tap_uring_kick(u);
        uring_register(u->fd, IORING_REGISTER_SYNC_CANCEL, &cancel, 1);
        /* The cancelled reads' completions, and the next link of each. */
        uring_enter(u->fd, 0, 0, IORING_ENTER_GETEVENTS);
        while (tap_uring_reap(u, &tap, &tag, &res))
            ;
    }
}

void tap_uring_close(struct tap_uring *u)
{
    if (!u)
        return;
    if (total_inflight(u))
        tap_uring_cancel(u);
    unmap_and_close(u);
}

/* The shmstream IO thread: see iothread.h and docs/modes.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "hvt_abi.h"
#include "iothread.h"
#include "shmstream_ring.h"
#include "solo5_ring.h"

#define SOLO5_MAX_HANDLES 64

struct io_port {
    int fd;
    struct shm_ring *rx;
    struct shm_ring *tx;
    uint32_t slots;
    uint32_t rx_prod;   /* trusted copies of the indices the host owns */
    uint32_t tx_cons;
    struct shm_counters c;
};

struct solo5_port {
    struct solo5_ring *ring;
    uint8_t *mem;
    uint64_t mem_size;
    int fd[SOLO5_MAX_HANDLES];
    uint32_t ent_head;   /* trusted copies of the host-owned indices */
    uint32_t com_tail;
    int stalled;         /* a read waits for commit room: sleep till a kick */
    struct solo5_ring_counters c;
};

struct iothread {
    int mode;
    uint32_t budget_us;
    int cpu;
    int kick_fd;
    int wake_fd;
    int stop_fd;
    int epfd;
    int nports;
    int started;
    volatile int stop;
    int wake_armed;     /* 1: the vCPU waits for (or will check) wake_fd */
    pthread_t thread;
    uint64_t final_cpu_ns;
    struct io_stats stats;
    struct io_port port[SHM_MAX_DEVICES];
    struct solo5_port s5;
    /* Where frames that cannot be delivered are read to be dropped. */
    uint8_t scratch[65536];
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void notify(int fd)
{
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is already non-zero, the wake-up is pending. */
    }
}

/* Guest -> tap: drain up to IO_BATCH frames of the TX ring. */
static int service_tx(struct io_port *p)
{
    uint32_t avail = shm_cons_avail(p->tx, p->tx_cons, p->slots);
    uint32_t i;

    if (avail == SHM_BAD) {
        p->c.tx_bad_index++;
        return 0;
    }
    if (avail > IO_BATCH)
        avail = IO_BATCH;
    for (i = 0; i < avail; i++) {
        struct shm_slot *s = shm_slot_at(p->tx, p->tx_cons + i, p->slots);
        /* Read the guest's length once: it may change it under us. */
        uint32_t len = __atomic_load_n(&s->len, __ATOMIC_RELAXED);
        ssize_t n;

        if (len == 0 || len > SHM_SLOT_DATA) {
            p->c.tx_drops_bad_len++;
            continue;
        }
        do
            n = write(p->fd, s->data, len);
        while (n < 0 && errno == EINTR);
        if (n < 0) {
            p->c.tx_drops_backend++;
            continue;
        }
        p->c.tx_frames++;
        p->c.tx_bytes += len;
    }
    if (avail) {
        p->tx_cons += avail;
        shm_cons_release(p->tx, p->tx_cons);
    }
    return (int)avail;
}

/* Publish what was filled since the last publish; wake the guest at most
 * once per batch, only if it sleeps and no wake-up is already pending. */
static void publish_rx(struct iothread *io, struct io_port *p)
{
    shm_prod_publish(p->rx, p->rx_prod);
    if (shm_prod_needs_notify(p->rx) && __atomic_exchange_n(&io->wake_armed, 0, __ATOMIC_ACQ_REL)) {
        notify(io->wake_fd);
        p->c.notify_sent++;
    } else {
        p->c.notify_suppressed++;
    }
}

/*
 * A frame is waiting but the ring looked full (or the guest's index is
 * impossible).  Read it first, then look again: the guest may have freed a
 * slot meanwhile, and only a frame that still finds no room is dropped.
 * Returns 1 if a frame was consumed from the backend, 0 if none waited.
 */
static int rx_when_full(struct iothread *io, struct io_port *p)
{
    ssize_t n = read(p->fd, io->scratch, sizeof(io->scratch));
    uint32_t space;

    if (n <= 0)
        return 0;
    space = shm_prod_space(p->rx, p->rx_prod, p->slots);
    if (space == SHM_BAD) {
        p->c.rx_bad_index++;
    } else if (space == 0) {
        p->c.rx_drops_full++;
    } else if (n > SHM_SLOT_DATA) {
        p->c.rx_drops_oversize++;
    } else {
        struct shm_slot *s = shm_slot_at(p->rx, p->rx_prod, p->slots);
        memcpy(s->data, io->scratch, (size_t)n);
        __atomic_store_n(&s->len, (uint32_t)n, __ATOMIC_RELAXED);
        p->rx_prod++;
        p->c.rx_frames++;
        p->c.rx_bytes += (uint64_t)n;
        return 2;
    }
    return 1;
}

/* Tap -> guest: fill up to IO_BATCH RX slots, publish once, notify once. */
static int service_rx(struct iothread *io, struct io_port *p)
{
    int moved = 0, seen = 0;

    while (seen < IO_BATCH) {
        uint32_t space = shm_prod_space(p->rx, p->rx_prod, p->slots);
        struct shm_slot *s;
        struct iovec iov[2];
        ssize_t n;

        if (space == SHM_BAD || space == 0) {
            int r = rx_when_full(io, p);
            if (!r)
                break;
            seen++;
            moved += r == 2;
            continue;
        }
        s = shm_slot_at(p->rx, p->rx_prod, p->slots);
        /* The second buffer only catches frames too large for a slot. */
        iov[0].iov_base = s->data;
        iov[0].iov_len = SHM_SLOT_DATA;
        iov[1].iov_base = io->scratch;
        iov[1].iov_len = sizeof(io->scratch);
        n = readv(p->fd, iov, 2);
        if (n < 0 && errno == EINTR)
            continue;
        /* Nothing waiting, an error, or 0 bytes (an empty datagram or a
         * backend at end of file): no frame for the guest. */
        if (n <= 0)
            break;
        seen++;
        if (n > SHM_SLOT_DATA) {
            p->c.rx_drops_oversize++;
            continue;
        }
        __atomic_store_n(&s->len, (uint32_t)n, __ATOMIC_RELAXED);
        p->rx_prod++;
        p->c.rx_frames++;
        p->c.rx_bytes += (uint64_t)n;
        moved++;
    }
    if (moved)
        publish_rx(io, p);
    return seen;
}

/* The guest buffer [gpa, gpa + len) as a host pointer, or NULL. */
static uint8_t *solo5_buffer(struct solo5_port *sp, uint64_t gpa, uint32_t len)
{
    if (len == 0 || gpa >= sp->mem_size || len > sp->mem_size - gpa)
        return NULL;
    return sp->mem + gpa;
}

/*
 * Solo5's ring: take submissions in order; writes go to the tap, reads are
 * answered at once with a commit (a frame or AGAIN), as the guest spins
 * for it.  Everything in an entry is copied once before it is checked.
 */
static int service_solo5(struct solo5_port *sp)
{
    struct solo5_ring *r = sp->ring;
    uint32_t avail = shm_load_acquire(&r->ent_tail) - sp->ent_head;
    uint32_t committed = 0;
    int done = 0;

    if (avail > SOLO5_RING_ENTRIES) {
        sp->c.bad_index++;
        return 0;
    }
    while (avail-- && done < IO_BATCH) {
        struct solo5_ring_entry e;
        uint8_t *buf;
        int fd;

        memcpy(&e, (const void *)&r->ent[sp->ent_head % SOLO5_RING_ENTRIES], sizeof(e));
        if (e.operation == SOLO5_RING_OP_READ) {
            uint32_t used = sp->com_tail - shm_load_acquire(&r->com_head);
            if (used > SOLO5_RING_ENTRIES) {
                sp->c.bad_index++;
                sp->stalled = 1;
                break;
            }
            if (used == SOLO5_RING_ENTRIES) {
                sp->c.commit_stalls++;
                sp->stalled = 1;
                break;
            }
        }
        fd = e.handle < SOLO5_MAX_HANDLES ? sp->fd[e.handle] : -1;
        buf = solo5_buffer(sp, e.data, e.len);
        if (e.operation == SOLO5_RING_OP_WRITE) {
            if (fd < 0 || !buf) {
                sp->c.bad_entries++;
            } else if (write(fd, buf, e.len) >= 0) {
                sp->c.writes++;
                sp->c.write_bytes += e.len;
            }
        } else if (e.operation == SOLO5_RING_OP_READ) {
            struct solo5_ring_commit *c = &r->com[sp->com_tail % SOLO5_RING_ENTRIES];
            int32_t ret = HVT_RET_EINVAL;
            uint32_t len = 0;
            if (fd >= 0 && buf) {
                /* A read into a page the guest may not write fails with
                 * EFAULT in the kernel: the host is never at risk. */
                ssize_t n = read(fd, buf, e.len);
                if (n >= 0) {
                    ret = HVT_RET_OK;
                    len = (uint32_t)n;
                    sp->c.reads++;
                    sp->c.read_bytes += (uint64_t)n;
                } else if (errno == EAGAIN) {
                    ret = HVT_RET_AGAIN;
                    sp->c.reads_again++;
                } else {
                    ret = HVT_RET_EUNSPEC;
                }
            } else {
                sp->c.bad_entries++;
            }
            c->id = e.id;
            c->ret = ret;
            c->len = len;
            c->reserved = 0;
            sp->com_tail++;
            committed++;
        } else {
            sp->c.bad_entries++;
        }
        sp->ent_head++;
        done++;
    }
    if (done)
        shm_store_release(&r->ent_head, sp->ent_head);
    if (committed)
        shm_store_release(&r->com_tail, sp->com_tail);
    return done;
}

void io_arm_wake(struct iothread *io)
{
    __atomic_store_n(&io->wake_armed, 1, __ATOMIC_SEQ_CST);
}

int io_service(struct iothread *io)
{
    int i, work = 0;
    for (i = 0; i < io->nports; i++) {
        work += service_tx(&io->port[i]);
        work += service_rx(io, &io->port[i]);
    }
    if (io->s5.ring)
        work += service_solo5(&io->s5);
    return work;
}

/* Awake: guests need not kick. */
static void wake_all(struct iothread *io)
{
    int i;
    for (i = 0; i < io->nports; i++)
        shm_cons_awake(io->port[i].tx);
    if (io->s5.ring)
        __atomic_store_n(&io->s5.ring->needs_kick, 0, __ATOMIC_RELAXED);
}

/* Announce sleep on every TX ring; 0 if frames arrived meanwhile. */
static int prepare_sleep(struct iothread *io)
{
    int i, ok = 1;
    for (i = 0; i < io->nports; i++) {
        struct io_port *p = &io->port[i];
        if (!shm_cons_prepare_sleep(p->tx, p->tx_cons, p->slots))
            ok = 0;
    }
    if (io->s5.ring) {
        struct solo5_ring *r = io->s5.ring;
        uint32_t pending;
        __atomic_store_n(&r->needs_kick, 1, __ATOMIC_RELAXED);
        shm_full_fence();
        /* Only work that can progress keeps us awake: an impossible
         * ent_tail, or reads waiting for commit room (the guest kicks again
         * once it has consumed commits), must not make this thread spin. */
        pending = shm_load_acquire(&r->ent_tail) - io->s5.ent_head;
        if (pending != 0 && pending <= SOLO5_RING_ENTRIES && !io->s5.stalled)
            ok = 0;
    }
    if (!ok)
        wake_all(io);
    return ok;
}

static void sleep_until_event(struct iothread *io)
{
    struct epoll_event ev[SHM_MAX_DEVICES + 2];
    uint64_t count;
    int i, n;

    io->stats.sleeps++;
    do
        n = epoll_wait(io->epfd, ev, SHM_MAX_DEVICES + 2, -1);
    while (n < 0 && errno == EINTR && !io->stop);
    io->stats.wakeups++;
    io->s5.stalled = 0;
    wake_all(io);
    for (i = 0; i < n; i++) {
        int fd = ev[i].data.fd;
        if (fd == io->kick_fd && read(io->kick_fd, &count, sizeof(count)) == 8)
            io->stats.kicks += count;
        else if (fd != io->stop_fd && fd != io->kick_fd && (ev[i].events & (EPOLLHUP | EPOLLERR)))
            /* A backend that hung up would wake us forever: stop watching it. */
            epoll_ctl(io->epfd, EPOLL_CTL_DEL, fd, NULL);
    }
}

static void run_poll(struct iothread *io)
{
    while (!io->stop) {
        if (io_service(io))
            io->stats.busy_passes++;
        else {
            io->stats.idle_spins++;
            cpu_relax();
        }
    }
}

static void run_event(struct iothread *io)
{
    while (!io->stop) {
        while (!io->stop && io_service(io))
            io->stats.busy_passes++;
        if (prepare_sleep(io))
            sleep_until_event(io);
    }
}

/*
 * NAPI-like: sleep in epoll while idle; once woken, keep polling while work
 * keeps arriving, and go back to sleep after budget_us without any.
 */
static void run_hybrid(struct iothread *io)
{
    uint64_t budget_ns = (uint64_t)io->budget_us * 1000u;
    uint64_t last_work = now_ns();

    while (!io->stop) {
        if (io_service(io)) {
            io->stats.busy_passes++;
            last_work = now_ns();
            continue;
        }
        if (now_ns() - last_work < budget_ns) {
            io->stats.idle_spins++;
            cpu_relax();
            continue;
        }
        if (prepare_sleep(io))
            sleep_until_event(io);
        last_work = now_ns();
    }
}

static void drain_tx(struct iothread *io)
{
    int i, rounds;
    for (i = 0; i < io->nports; i++)
        for (rounds = 0; rounds < 64 && service_tx(&io->port[i]); rounds++)
            ;
}

static void *io_main(void *arg)
{
    struct iothread *io = arg;

    if (io->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(io->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    switch (io->mode) {
    case IO_MODE_POLL:
        run_poll(io);
        break;
    case IO_MODE_HYBRID:
        run_hybrid(io);
        break;
    default:
        run_event(io);
        break;
    }
    /* Frames the guest queued before it halted still go out. */
    drain_tx(io);
    io->final_cpu_ns = thread_cpu_ns();
    return NULL;
}

struct iothread *io_create(int mode, uint32_t budget_us, int cpu, int kick_fd, int wake_fd)
{
    struct iothread *io = calloc(1, sizeof(*io));
    if (!io)
        return NULL;
    io->mode = mode;
    io->budget_us = budget_us;
    io->cpu = cpu;
    io->kick_fd = kick_fd;
    io->wake_fd = wake_fd;
    io->wake_armed = 1;
    io->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    io->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (io->stop_fd < 0 || io->epfd < 0) {
        io_destroy(io);
        return NULL;
    }
    return io;
}

static int watch(struct iothread *io, int fd)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return epoll_ctl(io->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

int io_add_port(struct iothread *io, int backend_fd, void *rx, void *tx, uint32_t slots)
{
    struct io_port *p;
    int err;

    if (io->started || io->nports >= SHM_MAX_DEVICES)
        return -EBUSY;
    if (slots == 0 || (slots & (slots - 1)) != 0)
        return -EINVAL;
    if ((err = watch(io, backend_fd)) < 0)
        return err;
    p = &io->port[io->nports];
    memset(p, 0, sizeof(*p));
    p->fd = backend_fd;
    p->rx = rx;
    p->tx = tx;
    p->slots = slots;
    /* Start from whatever the ring says, so a restart does not rewind. */
    p->rx_prod = p->rx->prod;
    p->tx_cons = p->tx->cons;
    return io->nports++;
}

int io_set_solo5_ring(struct iothread *io, void *ring, void *mem, uint64_t mem_size)
{
    int i;
    if (io->started)
        return -EBUSY;
    io->s5.ring = ring;
    io->s5.mem = mem;
    io->s5.mem_size = mem_size;
    for (i = 0; i < SOLO5_MAX_HANDLES; i++)
        io->s5.fd[i] = -1;
    io->s5.ent_head = io->s5.ring->ent_head;
    io->s5.com_tail = io->s5.ring->com_tail;
    return 0;
}

int io_solo5_attach(struct iothread *io, uint32_t handle, int backend_fd)
{
    if (io->started || !io->s5.ring || handle >= SOLO5_MAX_HANDLES)
        return -EINVAL;
    io->s5.fd[handle] = backend_fd;
    return 0;
}

struct solo5_ring_counters *io_solo5_counters(struct iothread *io)
{
    return &io->s5.c;
}

struct shm_counters *io_port_counters(struct iothread *io, int port)
{
    return port >= 0 && port < io->nports ? &io->port[port].c : NULL;
}

struct io_stats *io_thread_stats(struct iothread *io)
{
    return &io->stats;
}

int io_start(struct iothread *io)
{
    sigset_t all, old;
    int err;

    if (io->started)
        return -EBUSY;
    if ((err = watch(io, io->stop_fd)) < 0)
        return err;
    if (io->kick_fd >= 0 && (err = watch(io, io->kick_fd)) < 0)
        return err;
    /* Stop signals belong to the vCPU thread: the new thread inherits a
     * mask that blocks everything. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&io->thread, NULL, io_main, io);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err)
        return -err;
    io->started = 1;
    return 0;
}

void io_stop(struct iothread *io)
{
    if (!io->started)
        return;
    io->stop = 1;
    notify(io->stop_fd);
    pthread_join(io->thread, NULL);
    io->started = 0;
}

uint64_t io_cpu_ns(struct iothread *io)
{
    clockid_t clock;
    struct timespec ts;

    if (!io->started)
        return io->final_cpu_ns;
    if (pthread_getcpuclockid(io->thread, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void io_destroy(struct iothread *io)
{
    if (!io)
        return;
    io_stop(io);
    if (io->epfd >= 0)
        close(io->epfd);
    if (io->stop_fd >= 0)
        close(io->stop_fd);
    free(io);
}

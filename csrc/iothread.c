/* The IO thread itself: its modes, sleeping and waking, start and stop
 * (iothread.h, iothread_internal.h, docs/modes.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "iothread_internal.h"
#include "spin.h"

void io_notify(int fd)
{
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is already non-zero, the wake-up is pending. */
    }
}

void io_arm_wake(struct iothread *io)
{
    /* The vCPU thread, about to sleep: where it is (co-scheduling). */
    __atomic_store_n(&io->vcpu_cpu, sched_getcpu(), __ATOMIC_RELAXED);
    __atomic_store_n(&io->wake_armed, 1, __ATOMIC_SEQ_CST);
}

int io_wake_guest(struct iothread *io)
{
    if (!__atomic_exchange_n(&io->wake_armed, 0, __ATOMIC_ACQ_REL))
        return 0;
    io_notify(io->wake_fd);
    return 1;
}

void io_want_hand_off(struct iothread *io)
{
    io->hand_off = 1;
}

int io_add_service(struct iothread *io, const struct io_service_ops *ops, void *ctx)
{
    if (!ops || !ops->service)
        return -EINVAL;
    if (io->started)
        return -EBUSY;
    if (io->nservices >= IO_MAX_SERVICES)
        return -ENOSPC;
    io->service[io->nservices].ops = ops;
    io->service[io->nservices].ctx = ctx;
    io->nservices++;
    return 0;
}

/* io_pause's hold, between two passes: every service's batch published. */
static void hold(struct iothread *io)
{
    const struct timespec tick = { 0, 50000 };
    uint64_t count;

    __atomic_store_n(&io->paused, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&io->pause_req, __ATOMIC_ACQUIRE) && !io->stop)
        nanosleep(&tick, NULL);
    /* The stop_fd write that woke an epoll_wait for the pause; a stop's
     * write is never lost (stop is set before it, and checked after). */
    if (!io->stop && read(io->stop_fd, &count, sizeof(count)) < 0) {
        /* EAGAIN: the thread was not asleep when the pause came. */
    }
    __atomic_store_n(&io->paused, 0, __ATOMIC_RELEASE);
}

/* One pass over every service: work done. */
static int run_services(struct iothread *io)
{
    int i, work = 0;

    if (__atomic_load_n(&io->pause_req, __ATOMIC_ACQUIRE)) {
        hold(io);
        if (io->stop)  /* stopped while paused: not one frame more */
            return 0;
    }
    for (i = 0; i < io->nservices; i++)
        work += io->service[i].ops->service(io->service[i].ctx);
    return work;
}

/* Awake: guests need not kick. */
static void wake_all(struct iothread *io)
{
    int i;
    for (i = 0; i < io->nservices; i++)
        if (io->service[i].ops->awake)
            io->service[i].ops->awake(io->service[i].ctx);
}

/* Announce sleep to every service; 0 if work arrived meanwhile. */
static int prepare_sleep(struct iothread *io)
{
    int i, ok = 1;
    for (i = 0; i < io->nservices; i++) {
        const struct io_service *s = &io->service[i];
        if (s->ops->prepare_sleep && !s->ops->prepare_sleep(s->ctx))
            ok = 0;
    }
    if (!ok)
        wake_all(io);
    return ok;
}

/* Events taken per epoll_wait; more ready fds are reported by the next
 * one (level-triggered). */
#define IO_EVENTS 32

static void sleep_until_event(struct iothread *io)
{
    struct epoll_event ev[IO_EVENTS];
    uint64_t count;
    int i, n;

    io->stats.sleeps++;
    do
        n = epoll_wait(io->epfd, ev, IO_EVENTS, -1);
    while (n < 0 && errno == EINTR && !io->stop);
    io->stats.wakeups++;
    for (i = 0; i < io->nservices; i++)
        if (io->service[i].ops->drain)
            io->service[i].ops->drain(io->service[i].ctx);
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

/*
 * Between passes that found nothing, poll and hybrid give the CPU away if
 * anything else is runnable on it: on a host with fewer cores than busy
 * threads the vCPU thread (woken by our notify) is often queued behind
 * this very thread, and a pause-loop would hold it off until the
 * scheduler's tick or the hybrid budget ran out (measured: the hybrid
 * round trip grew by the whole budget, 344 us at 200 us; docs/modes.md).
 * With nothing else runnable sched_yield returns at once.
 */
static void spin_pause(void)
{
    sched_yield();
}

/*
 * Co-scheduling: when a service says its guest is behind (an RX ring
 * three quarters full), the thread gives the CPU away after the pass, so
 * that a vCPU queued on this thread's core drains the ring before the next
 * pass reads frames that would find no slot (each read, then dropped,
 * costs the whole read).  Only when the vCPU is pinned to this thread's
 * core: elsewhere it is not queued here (docs/modes.md, "Co-scheduling").
 */
static void hand_off(struct iothread *io)
{
    if (!io->hand_off)
        return;
    io->hand_off = 0;
    /* Only to a vCPU known to share this thread's core: both pinned
     * there (--pin), and the vCPU last went to sleep on it.  Unpinned,
     * the hand-off measured worse in event mode (docs/modes.md). */
    if (io->cpu < 0 || __atomic_load_n(&io->vcpu_cpu, __ATOMIC_RELAXED) != io->cpu)
        return;
    io->stats.handoffs++;
    sched_yield();
}

/* One pass, then a hand-off if it woke the vCPU: work done. */
static int run_pass(struct iothread *io)
{
    int work = run_services(io);
    hand_off(io);
    return work;
}

static void run_poll(struct iothread *io)
{
    while (!io->stop) {
        if (run_pass(io))
            io->stats.busy_passes++;
        else {
            io->stats.idle_spins++;
            spin_pause();
        }
    }
}

static void run_event(struct iothread *io)
{
    while (!io->stop) {
        while (!io->stop && run_pass(io))
            io->stats.busy_passes++;
        if (prepare_sleep(io))
            sleep_until_event(io);
    }
}

/* Whether every service says polling while idle can help its guest. */
static int idle_poll_helps(struct iothread *io)
{
    int i;
    for (i = 0; i < io->nservices; i++)
        if (io->service[i].ops->idle_poll && !io->service[i].ops->idle_poll(io->service[i].ctx))
            return 0;
    return 1;
}

/*
 * NAPI-like: sleep in epoll while idle; once woken, keep polling while work
 * keeps arriving, and go back to sleep after budget_us without any (at
 * once where a service says idle polling cannot help its guest).
 */
static void run_hybrid(struct iothread *io)
{
    uint64_t budget_ns = (uint64_t)io->budget_us * 1000u;
    uint64_t last_work = clock_ns(CLOCK_MONOTONIC);

    while (!io->stop) {
        if (run_pass(io)) {
            io->stats.busy_passes++;
            last_work = clock_ns(CLOCK_MONOTONIC);
            continue;
        }
        if (clock_ns(CLOCK_MONOTONIC) - last_work < budget_ns && idle_poll_helps(io)) {
            io->stats.idle_spins++;
            spin_pause();
            continue;
        }
        if (prepare_sleep(io))
            sleep_until_event(io);
        last_work = clock_ns(CLOCK_MONOTONIC);
    }
}

static void finish_services(struct iothread *io)
{
    int i;
    for (i = 0; i < io->nservices; i++)
        if (io->service[i].ops->finish)
            io->service[i].ops->finish(io->service[i].ctx);
}

static void *io_main(void *arg)
{
    struct iothread *io = arg;

    __atomic_store_n(&io->tid, (int)gettid(), __ATOMIC_RELEASE);
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
    /* Work the guest queued before it halted still gets done; not after a
     * snapshot that ends the run (io_stop while paused): the snapshot holds
     * that work, and its restore does it. */
    if (!__atomic_load_n(&io->pause_req, __ATOMIC_ACQUIRE))
        finish_services(io);
    io->final_cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
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
    io->vcpu_cpu = -1;
    io->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    io->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (io->stop_fd < 0 || io->epfd < 0) {
        io_destroy(io);
        return NULL;
    }
    return io;
}

int io_watch_fd(struct iothread *io, int fd)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    return epoll_ctl(io->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

struct io_stats *io_thread_stats(struct iothread *io)
{
    return &io->stats;
}

int io_start(struct iothread *io)
{
    sigset_t all, old;
    pthread_attr_t attr;
    cpu_set_t set;
    int err;

    if (io->started)
        return -EBUSY;
    if ((err = io_watch_fd(io, io->stop_fd)) < 0)
        return err;
    if (io->kick_fd >= 0 && (err = io_watch_fd(io, io->kick_fd)) < 0)
        return err;
    /* Stop signals belong to the vCPU thread: the new thread inherits a
     * mask that blocks everything. */
    sigfillset(&all);
    /* --pin: the thread is created on its CPU, so not even its first
     * instructions run elsewhere (setting it from inside the thread left
     * a window where it ran wherever the scheduler put it). */
    if ((err = pthread_attr_init(&attr)) != 0)
        return -err;
    if (io->cpu >= 0) {
        CPU_ZERO(&set);
        CPU_SET(io->cpu, &set);
        if ((err = pthread_attr_setaffinity_np(&attr, sizeof(set), &set)) != 0) {
            pthread_attr_destroy(&attr);
            return -err;
        }
    }
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&io->thread, &attr, io_main, io);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err)
        return -err;
    io->started = 1;
    /* Its id is known before anyone asks for it (its switch counters are
     * opened by id, before the sandbox refuses open). */
    while (!__atomic_load_n(&io->tid, __ATOMIC_ACQUIRE))
        sched_yield();
    return 0;
}

int io_thread_tid(struct iothread *io)
{
    return io->started ? __atomic_load_n(&io->tid, __ATOMIC_ACQUIRE) : 0;
}

void io_stop(struct iothread *io)
{
    if (!io->started)
        return;
    io->stop = 1;
    io_notify(io->stop_fd);
    pthread_join(io->thread, NULL);
    io->started = 0;
    io->tid = 0;
}

int io_pause(struct iothread *io)
{
    const struct timespec tick = { 0, 20000 };

    if (!io->started)
        return 0;
    __atomic_store_n(&io->pause_req, 1, __ATOMIC_RELEASE);
    io_notify(io->stop_fd);  /* out of epoll_wait, in event and hybrid mode */
    while (!__atomic_load_n(&io->paused, __ATOMIC_ACQUIRE))
        nanosleep(&tick, NULL);
    return 0;
}

void io_resume(struct iothread *io)
{
    const struct timespec tick = { 0, 20000 };

    if (!__atomic_load_n(&io->pause_req, __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&io->pause_req, 0, __ATOMIC_RELEASE);
    /* Its hold is over before a second pause can ask again. */
    while (io->started && __atomic_load_n(&io->paused, __ATOMIC_ACQUIRE))
        nanosleep(&tick, NULL);
}

uint64_t io_cpu_ns(struct iothread *io)
{
    clockid_t clock;

    if (!io->started)
        return io->final_cpu_ns;
    if (pthread_getcpuclockid(io->thread, &clock) != 0)
        return 0;
    return clock_ns(clock);
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

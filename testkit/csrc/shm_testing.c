/* See shm_testing.h. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "iothread_internal.h"
#include "shm_testing.h"
#include "shmstream_ring.h"

int io_test_service(void *io)
{
    struct iothread *t = io;
    int i, work = 0;

    for (i = 0; i < t->nservices; i++)
        work += t->service[i].ops->service(t->service[i].ctx);
    return work;
}

int io_test_prepare_sleep(void *io)
{
    struct iothread *t = io;
    int i, ok = 1;

    for (i = 0; i < t->nservices; i++)
        if (t->service[i].ops->prepare_sleep &&
            !t->service[i].ops->prepare_sleep(t->service[i].ctx))
            ok = 0;
    return ok;
}

void io_test_drain(void *io)
{
    struct iothread *t = io;
    int i;

    for (i = 0; i < t->nservices; i++)
        if (t->service[i].ops->drain)
            t->service[i].ops->drain(t->service[i].ctx);
}

void io_test_awake(void *io)
{
    struct iothread *t = io;
    int i;

    for (i = 0; i < t->nservices; i++)
        if (t->service[i].ops->awake)
            t->service[i].ops->awake(t->service[i].ctx);
}

void io_test_solo5_linger(void *io, uint64_t ns)
{
    ((struct iothread *)io)->s5.linger_ns = ns;
}

void io_test_solo5_hold(void *io, int held)
{
    __atomic_store_n(&((struct iothread *)io)->s5.busy, held, __ATOMIC_RELEASE);
}

int io_test_idle_poll(void *io)
{
    struct iothread *t = io;
    int i;

    for (i = 0; i < t->nservices; i++)
        if (t->service[i].ops->idle_poll && !t->service[i].ops->idle_poll(t->service[i].ctx))
            return 0;
    return 1;
}

uint32_t shm_test_prod_space(void *ring, uint32_t prod, uint32_t slots)
{
    return shm_prod_space(ring, prod, slots);
}

void shm_test_prod_publish(void *ring, uint32_t prod)
{
    shm_prod_publish(ring, prod);
}

int shm_test_prod_needs_notify(void *ring)
{
    return shm_prod_needs_notify(ring);
}

uint32_t shm_test_cons_avail(void *ring, uint32_t cons, uint32_t slots)
{
    return shm_cons_avail(ring, cons, slots);
}

void shm_test_cons_release(void *ring, uint32_t cons)
{
    shm_cons_release(ring, cons);
}

int shm_test_cons_prepare_sleep(void *ring, uint32_t cons, uint32_t slots)
{
    return shm_cons_prepare_sleep(ring, cons, slots);
}

void shm_test_cons_awake(void *ring)
{
    shm_cons_awake(ring);
}

void *shm_test_slot(void *ring, uint32_t index, uint32_t slots)
{
    return shm_slot_at(ring, index, slots);
}

uint64_t shm_test_ring_size(uint32_t slots)
{
    return sizeof(struct shm_ring) + (uint64_t)slots * sizeof(struct shm_slot);
}

/* ---- two-thread stress (shm_test_stress) ------------------------------- */

#define STRESS_HEADER 16  /* sequence number, checksum */

struct stress {
    struct shm_ring *ring;
    uint32_t slots;
    uint32_t start;
    uint64_t frames;
    uint32_t max_batch;
    uint32_t flags;
    uint32_t consumer_spin;
    uint64_t timeout_ns;
    uint64_t deadline_ns;   /* pushed on whenever a frame moves */
    uint32_t seen;          /* prod + cons when the deadline was set */
    int efd;
    uint32_t done;      /* producer finished (everything published) */
    uint32_t abort;     /* time limit hit or broken ring: both sides stop */
    uint32_t timed_out;
    /* Each thread counts into its own result, on its own cache lines. */
    struct shm_stress_result pr __attribute__((aligned(SHM_CACHE_LINE)));
    struct shm_stress_result cr __attribute__((aligned(SHM_CACHE_LINE)));
};

static uint64_t stress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void stress_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Mostly small frames, every 997th one fills a slot. */
static uint32_t stress_len(uint64_t seq)
{
    if (seq % 997 == 0)
        return SHM_SLOT_DATA;
    return STRESS_HEADER + (uint32_t)(splitmix(seq) % 113);
}

static uint64_t fnv1a(const uint8_t *p, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint32_t i;
    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Frame `seq` into buf: number, checksum, pseudo-random payload; its length. */
static uint32_t stress_build(uint64_t seq, uint8_t *buf)
{
    uint32_t len = stress_len(seq), j;
    uint64_t x = splitmix(seq * 31 + 7), sum;

    for (j = STRESS_HEADER; j < len; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[j] = (uint8_t)x;
    }
    sum = fnv1a(buf + STRESS_HEADER, len - STRESS_HEADER);
    memcpy(buf, &seq, 8);
    memcpy(buf + 8, &sum, 8);
    return len;
}

/*
 * Nothing moved for timeout_ns: the ring is stuck.  A slow run (a loaded
 * machine) is not a stuck one, so any progress pushes the deadline on; the
 * two threads may race on these fields, which only moves it a little.
 */
static int stress_stalled(struct stress *s)
{
    uint32_t moved = __atomic_load_n(&s->ring->prod, __ATOMIC_RELAXED) +
                     __atomic_load_n(&s->ring->cons, __ATOMIC_RELAXED);
    uint64_t now = stress_now();

    if (moved != __atomic_load_n(&s->seen, __ATOMIC_RELAXED)) {
        __atomic_store_n(&s->seen, moved, __ATOMIC_RELAXED);
        __atomic_store_n(&s->deadline_ns, now + s->timeout_ns, __ATOMIC_RELAXED);
        return 0;
    }
    return now > __atomic_load_n(&s->deadline_ns, __ATOMIC_RELAXED);
}

/*
 * One more wait in a row (the caller zeroes *waits on progress).  Spin
 * first; then yield now and then; after a long wait sleep briefly, so that
 * on a loaded machine (CI, other processes spinning) the peer thread gets a
 * CPU instead of a sched_yield() that hands it straight back.  Reports the
 * time limit.
 */
static int stress_wait(struct stress *s, uint32_t *waits)
{
    if (++*waits % 64 == 0) {
        if (*waits < 1024) {
            sched_yield();
        } else {
            struct timespec nap = { 0, 20000 };
            nanosleep(&nap, NULL);
        }
        if (stress_stalled(s)) {
            __atomic_store_n(&s->timed_out, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&s->abort, 1, __ATOMIC_RELAXED);
        }
    } else {
        stress_relax();
    }
    return __atomic_load_n(&s->abort, __ATOMIC_RELAXED);
}

static void stress_notify(struct stress *s)
{
    uint64_t one = 1;
    if (write(s->efd, &one, sizeof(one)) < 0) {
        /* EAGAIN cannot happen below 2^64 - 1; nothing else to do */
    }
}

static void *stress_producer(void *arg)
{
    struct stress *s = arg;
    struct shm_ring *r = s->ring;
    uint32_t prod = s->start, spins = 0;
    uint64_t seq = 0;
    uint8_t scratch[SHM_SLOT_DATA];
    int drop = s->flags & SHM_STRESS_DROP_WHEN_FULL;
    int sleeping = s->flags & SHM_STRESS_SLEEPING_CONSUMER;

    prctl(PR_SET_TIMERSLACK, 1UL);   /* a 20 us nap, not the default 50 */

    while (seq < s->frames) {
        uint32_t space = shm_prod_space(r, prod, s->slots), n, i;

        if (space == SHM_BAD) {
            s->pr.bad_index++;
            __atomic_store_n(&s->abort, 1, __ATOMIC_RELAXED);
            break;
        }
        if (space == 0) {
            if (drop) {
                /* The frame arrived anyway: building it costs the same. */
                stress_build(seq, scratch);
                s->pr.dropped++;
                s->pr.sent++;
                seq++;
                continue;
            }
            if (stress_wait(s, &spins))
                break;
            continue;
        }
        spins = 0;
        n = 1 + (uint32_t)(splitmix(seq ^ 0x5555) % s->max_batch);
        if (n > space)
            n = space;
        if (n > s->frames - seq)
            n = (uint32_t)(s->frames - seq);
        for (i = 0; i < n; i++, seq++, prod++) {
            struct shm_slot *slot = shm_slot_at(r, prod, s->slots);
            slot->len = stress_build(seq, slot->data);
        }
        s->pr.sent += n;
        shm_prod_publish(r, prod);
        if (sleeping && shm_prod_needs_notify(r)) {
            s->pr.notifies++;
            stress_notify(s);
        }
    }
    __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
    if (sleeping)
        stress_notify(s);   /* the consumer may sleep waiting for more */
    return NULL;
}

/* Block until the eventfd is signalled or ms pass; 1 if signalled. */
static int stress_sleep(struct stress *s, int ms)
{
    struct pollfd pfd = { .fd = s->efd, .events = POLLIN };
    uint64_t count;
    int n;

    do
        n = poll(&pfd, 1, ms);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return 0;
    if (read(s->efd, &count, sizeof(count)) < 0) {
        /* drained by an earlier read: fine */
    }
    return 1;
}

static void stress_consume(struct stress *s, struct shm_slot *slot, uint64_t *next)
{
    uint32_t len = slot->len;
    uint64_t seq, sum;

    if (len < STRESS_HEADER || len > SHM_SLOT_DATA) {
        s->cr.bad_length++;
        return;
    }
    memcpy(&seq, slot->data, 8);
    memcpy(&sum, slot->data + 8, 8);
    if (seq < *next) {
        s->cr.out_of_order++;
        return;
    }
    s->cr.gaps += seq - *next;
    *next = seq + 1;
    s->cr.last_seq = seq;
    if (len != stress_len(seq))
        s->cr.bad_length++;
    else if (fnv1a(slot->data + STRESS_HEADER, len - STRESS_HEADER) != sum)
        s->cr.bad_checksum++;
    else
        s->cr.delivered++;
}

static void *stress_consumer(void *arg)
{
    struct stress *s = arg;
    struct shm_ring *r = s->ring;
    uint32_t cons = s->start, spins = 0, k;
    uint64_t next = 0;
    int sleeping = s->flags & SHM_STRESS_SLEEPING_CONSUMER;

    prctl(PR_SET_TIMERSLACK, 1UL);

    for (;;) {
        uint32_t avail = shm_cons_avail(r, cons, s->slots), n, i;

        if (avail == SHM_BAD) {
            s->cr.bad_index++;
            __atomic_store_n(&s->abort, 1, __ATOMIC_RELAXED);
            break;
        }
        if (avail == 0) {
            if (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) {
                /* everything was published before done was set */
                if (shm_cons_avail(r, cons, s->slots) == 0)
                    break;
                continue;
            }
            if (sleeping && shm_cons_prepare_sleep(r, cons, s->slots)) {
                s->cr.sleeps++;
                if (!stress_sleep(s, 200)) {
                    uint32_t waiting = shm_cons_avail(r, cons, s->slots);
                    /* Frames published but no wake-up: give the producer
                     * a second to get to its notify before calling it lost. */
                    if (waiting != 0 && waiting != SHM_BAD && !stress_sleep(s, 1000))
                        s->cr.lost_wakeups++;
                    if (stress_stalled(s)) {
                        __atomic_store_n(&s->timed_out, 1, __ATOMIC_RELAXED);
                        __atomic_store_n(&s->abort, 1, __ATOMIC_RELAXED);
                    }
                }
                shm_cons_awake(r);
                if (__atomic_load_n(&s->abort, __ATOMIC_RELAXED))
                    break;
                continue;
            }
            if (!sleeping && stress_wait(s, &spins))
                break;
            if (sleeping && __atomic_load_n(&s->abort, __ATOMIC_RELAXED))
                break;
            continue;
        }
        spins = 0;
        n = 1 + (uint32_t)(splitmix(cons) % s->max_batch);
        if (n > avail)
            n = avail;
        for (i = 0; i < n; i++, cons++) {
            stress_consume(s, shm_slot_at(r, cons, s->slots), &next);
            for (k = 0; k < s->consumer_spin; k++)
                stress_relax();
        }
        shm_cons_release(r, cons);
    }
    return NULL;
}

int shm_test_stress(uint32_t slots, uint64_t frames, uint32_t start_index, uint32_t max_batch,
                    uint32_t flags, uint32_t consumer_spin, uint32_t timeout_ms,
                    struct shm_stress_result *out)
{
    struct stress *s;
    pthread_t prod_thread, cons_thread;
    uint64_t t0;
    int err;

    if (slots == 0 || (slots & (slots - 1)) != 0 || max_batch == 0 || !out)
        return -EINVAL;
    s = aligned_alloc(SHM_CACHE_LINE, sizeof(*s));
    if (s)
        memset(s, 0, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->ring = aligned_alloc(SHM_CACHE_LINE, shm_test_ring_size(slots));
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!s->ring || s->efd < 0) {
        err = s->ring ? -errno : -ENOMEM;
        goto out;
    }
    memset(s->ring, 0, shm_test_ring_size(slots));
    s->ring->prod = s->ring->cons = start_index;
    s->ring->slots = slots;
    s->ring->slot_size = SHM_SLOT_SIZE;
    s->slots = slots;
    s->start = start_index;
    s->frames = frames;
    s->max_batch = max_batch;
    s->flags = flags;
    s->consumer_spin = consumer_spin;
    t0 = stress_now();
    s->timeout_ns = (uint64_t)timeout_ms * 1000000u;
    s->deadline_ns = t0 + s->timeout_ns;
    s->seen = start_index + start_index;

    if ((err = pthread_create(&cons_thread, NULL, stress_consumer, s)) != 0) {
        err = -err;
        goto out;
    }
    if ((err = pthread_create(&prod_thread, NULL, stress_producer, s)) != 0) {
        __atomic_store_n(&s->abort, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
        stress_notify(s);
        pthread_join(cons_thread, NULL);
        err = -err;
        goto out;
    }
    pthread_join(prod_thread, NULL);
    pthread_join(cons_thread, NULL);
    memset(out, 0, sizeof(*out));
    out->sent = s->pr.sent;
    out->dropped = s->pr.dropped;
    out->notifies = s->pr.notifies;
    out->bad_index = s->pr.bad_index + s->cr.bad_index;
    out->delivered = s->cr.delivered;
    out->gaps = s->cr.gaps;
    out->out_of_order = s->cr.out_of_order;
    out->bad_length = s->cr.bad_length;
    out->bad_checksum = s->cr.bad_checksum;
    out->sleeps = s->cr.sleeps;
    out->lost_wakeups = s->cr.lost_wakeups;
    out->last_seq = s->cr.last_seq;
    out->timed_out = s->timed_out;
    out->elapsed_ns = stress_now() - t0;
    err = 0;
out:
    if (s->efd >= 0)
        close(s->efd);
    free(s->ring);
    free(s);
    return err;
}

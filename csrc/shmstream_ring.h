/*
 * shmstream ring operations, shared by the host IO thread and the guest
 * driver (both include this file, so both run the same protocol code; the
 * unit tests drive it through cffi).  Layout: shmstream.h.
 *
 * Each side keeps its own index (the producer its prod, the consumer its
 * cons) in private memory and only publishes it; the other side's index is
 * read from the ring and validated, never trusted: a distance larger than
 * the ring means the peer is broken or hostile, reported as SHM_BAD.
 *
 * Barriers use GCC's __atomic builtins: on x86_64 acquire/release cost
 * nothing but a compiler barrier (TSO) and the full fence is an mfence or
 * locked op; on aarch64 they become ldar/stlr and dmb ish.  The full fence
 * is what makes the sleep-flag handshake safe: "publish my index, fence,
 * read the peer's sleep flag" against "set my sleep flag, fence, re-read
 * the peer's index": at least one side sees the other's write.
 */
#ifndef PYVMM_SHMSTREAM_RING_H
#define PYVMM_SHMSTREAM_RING_H

#include <stdint.h>
#include "shmstream.h"

#define SHM_BAD 0xffffffffu

static inline uint32_t shm_load_acquire(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void shm_store_release(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void shm_full_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static inline struct shm_slot *shm_slot_at(struct shm_ring *r, uint32_t index,
                                           uint32_t slots)
{
    return &r->slot[index & (slots - 1)];
}

/* Producer: free slots given our prod, or SHM_BAD if the consumer's index
 * is impossible (ahead of prod, or more than a ring behind). */
static inline uint32_t shm_prod_space(const struct shm_ring *r, uint32_t prod,
                                      uint32_t slots)
{
    uint32_t used = prod - shm_load_acquire(&r->cons);
    return used > slots ? SHM_BAD : slots - used;
}

/* Producer: make slots up to (not including) prod visible. */
static inline void shm_prod_publish(struct shm_ring *r, uint32_t prod)
{
    shm_store_release(&r->prod, prod);
}

/* Producer, after publishing: must the consumer be notified? */
static inline int shm_prod_needs_notify(const struct shm_ring *r)
{
    shm_full_fence();
    return __atomic_load_n(&r->cons_sleeping, __ATOMIC_RELAXED) != 0;
}

/* Consumer: frames waiting given our cons, or SHM_BAD if the producer's
 * index is impossible. */
static inline uint32_t shm_cons_avail(const struct shm_ring *r, uint32_t cons,
                                      uint32_t slots)
{
    uint32_t avail = shm_load_acquire(&r->prod) - cons;
    return avail > slots ? SHM_BAD : avail;
}

/* Consumer: give slots before cons back to the producer. */
static inline void shm_cons_release(struct shm_ring *r, uint32_t cons)
{
    shm_store_release(&r->cons, cons);
}

/*
 * Consumer about to sleep: announce it, then look once more.  Returns 1 if
 * the ring is still empty or the producer's index is impossible (sleep; the
 * producer will notify), 0 if frames arrived meanwhile (the flag is
 * withdrawn; go on consuming).
 */
static inline int shm_cons_prepare_sleep(struct shm_ring *r, uint32_t cons,
                                         uint32_t slots)
{
    uint32_t avail;

    __atomic_store_n(&r->cons_sleeping, 1, __ATOMIC_RELAXED);
    shm_full_fence();
    avail = shm_cons_avail(r, cons, slots);
    /* An impossible producer index gives nothing to consume either: sleep
     * (a broken peer must not make its consumer spin). */
    if (avail == 0 || avail == SHM_BAD)
        return 1;
    __atomic_store_n(&r->cons_sleeping, 0, __ATOMIC_RELAXED);
    return 0;
}

/* Consumer awake again: producers may stop notifying. */
static inline void shm_cons_awake(struct shm_ring *r)
{
    __atomic_store_n(&r->cons_sleeping, 0, __ATOMIC_RELAXED);
}

#endif /* PYVMM_SHMSTREAM_RING_H */

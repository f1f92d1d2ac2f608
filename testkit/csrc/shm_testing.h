/*
 * The shared ring operations (shmstream_ring.h, static inline) exported as
 * functions so the unit tests drive exactly the code guests and the IO
 * thread run.  Not used by pyvmm itself.
 */
#ifndef PYVMM_SHM_TESTING_H
#define PYVMM_SHM_TESTING_H

#include <stdint.h>

#define SHM_TEST_BAD 4294967295

uint32_t shm_test_prod_space(void *ring, uint32_t prod, uint32_t slots);
void shm_test_prod_publish(void *ring, uint32_t prod);
int shm_test_prod_needs_notify(void *ring);
uint32_t shm_test_cons_avail(void *ring, uint32_t cons, uint32_t slots);
void shm_test_cons_release(void *ring, uint32_t cons);
int shm_test_cons_prepare_sleep(void *ring, uint32_t cons, uint32_t slots);
void shm_test_cons_awake(void *ring);
void *shm_test_slot(void *ring, uint32_t index, uint32_t slots);
/* Bytes needed for one ring of `slots` slots. */
uint64_t shm_test_ring_size(uint32_t slots);

/*
 * One pass of every service of a pyvmm IO thread (a `struct iothread *`
 * from pyvmm._native, not started), on the calling thread: the work its
 * services report.  What the thread's loop runs, driven step by step.
 */
int io_test_service(void *io);
/* The thread's other steps, one at a time on the calling thread: whether
 * every service agrees to sleep (each has announced it: prepare_sleep), a
 * wake-up's drain, and whether idle polling helps every service. */
int io_test_prepare_sleep(void *io);
void io_test_drain(void *io);
/* What each service does once the thread is awake again (its awake op). */
void io_test_awake(void *io);
int io_test_idle_poll(void *io);
/* How long the Solo5 ring's thread lingers after a read (a test's own
 * window: 100 us, the default, is shorter than a preempted test step). */
void io_test_solo5_linger(void *io, uint64_t ns);
/* Hold Solo5's ring as a thread serving it does (1), or give it back (0):
 * what the other side then meets. */
void io_test_solo5_hold(void *io, int held);

/*
 * Two-thread stress of one ring: a producer pthread and a consumer pthread
 * move `frames` frames through a private ring of `slots` slots whose indices
 * start at `start_index` (pick one near 2^32 to cross the wrap).  Each frame
 * carries its sequence number and a checksum of its payload; lengths vary
 * from 16 bytes to SHM_SLOT_DATA.  The producer publishes batches of 1 to
 * `max_batch` frames, the consumer releases batches of 1 to `max_batch`.
 * Flags:
 *   SHM_STRESS_DROP_WHEN_FULL     the producer drops (and counts) a frame
 *                                 when the ring is full instead of waiting;
 *   SHM_STRESS_SLEEPING_CONSUMER  an empty ring makes the consumer run the
 *                                 sleep-flag handshake and block on an
 *                                 eventfd the producer signals when
 *                                 shm_prod_needs_notify says so.
 * consumer_spin: pause instructions per consumed frame (a slow consumer).
 * timeout_ms bounds a stall: when no frame has moved for that long both
 * threads stop and timed_out is 1 (a slow run on a loaded machine goes on).
 * Returns 0, or -errno for bad arguments or resource failures.
 */
#define SHM_STRESS_DROP_WHEN_FULL 1
#define SHM_STRESS_SLEEPING_CONSUMER 2

struct shm_stress_result {
    uint64_t sent;          /* frames the producer handled (published or dropped) */
    uint64_t delivered;     /* frames the consumer received intact */
    uint64_t dropped;       /* frames the producer dropped on a full ring */
    uint64_t gaps;          /* sequence numbers the consumer never saw */
    uint64_t out_of_order;  /* frames whose number did not increase: duplicate or reordered */
    uint64_t bad_length;    /* frames whose length does not match their number */
    uint64_t bad_checksum;  /* frames whose payload does not match their checksum */
    uint64_t bad_index;     /* SHM_BAD returned to either side */
    uint64_t sleeps;        /* consumer: prepare_sleep returned 1 */
    uint64_t notifies;      /* producer: needs_notify returned 1 */
    uint64_t lost_wakeups;  /* sleeps that frames waiting for over 1 s did not end */
    uint64_t timed_out;
    uint64_t last_seq;      /* last sequence number the consumer received */
    uint64_t elapsed_ns;
};

int shm_test_stress(uint32_t slots, uint64_t frames, uint32_t start_index, uint32_t max_batch,
                    uint32_t flags, uint32_t consumer_spin, uint32_t timeout_ms,
                    struct shm_stress_result *out);

#endif

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

#endif

/* See shm_testing.h. */
#include "shm_testing.h"
#include "shmstream_ring.h"

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

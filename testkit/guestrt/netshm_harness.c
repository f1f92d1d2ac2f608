/*
 * guests/runtime/net_shm.c itself (its unchanged text: the builder copies
 * it into a directory of its own, so that its #include "hypercall.h" finds
 * this directory's double, not the real header beside it), plus what the
 * tests need that only its own translation unit can do: put its statics
 * back to zero between tests, and call its driver's operations.
 */
#include "net_shm.c"

#include "guestnet.h"

void gh_netshm_reset(void)
{
    memset(devs, 0, sizeof(devs));
    region_state = REGION_UNKNOWN;
    memset(&region, 0, sizeof(region));
    memset(&yield_ops, 0, sizeof(yield_ops));
}

int gh_probe(uint64_t h)
{
    const struct mft *m = rt_manifest();
    const struct rt_net_driver *drv = rt_net_shm_probe(h, &m->e[h]);
    if (drv == NULL)
        return 0;
    return drv == &rt_net_shm_driver ? 1 : -1;
}

const char *gh_driver_name(void)
{
    return rt_net_shm_driver.name;
}

int gh_driver_shm(void)
{
    return rt_net_shm_driver.shm;
}

int gh_write(uint64_t h, const uint8_t *buf, size_t size)
{
    return rt_net_shm_driver.write(h, buf, size);
}

int gh_read(uint64_t h, uint8_t *buf, size_t size, size_t *read_size)
{
    return rt_net_shm_driver.read(h, buf, size, read_size);
}

int gh_read_zc(uint64_t h, uint8_t **frame, size_t *len)
{
    return rt_net_shm_driver.read_zc(h, frame, len);
}

void gh_read_done(uint64_t h)
{
    rt_net_shm_driver.read_done(h);
}

int gh_queue(uint64_t h, const uint8_t *buf, size_t size)
{
    return rt_net_shm_driver.queue(h, buf, size);
}

void gh_flush(uint64_t h)
{
    rt_net_shm_driver.flush(h);
}

int gh_tx_wait(uint64_t h)
{
    return rt_net_shm_driver.tx_wait(h);
}

void gh_stats(uint64_t h, struct pyvmm_net_stats *out)
{
    rt_net_shm_driver.stats(h, out);
}

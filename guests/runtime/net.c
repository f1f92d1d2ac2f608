/*
 * Solo5 network API and pyvmm's batching additions (rt.h): checks handles
 * and sizes, then hands the frame to the device's back end (rt_internal.h).
 * The back end is chosen when the device is acquired: the shmstream rings
 * (net_shm.c) if pyvmm offers them for the device, else the hypercalls
 * (net_hvt.c), which is also what a device that was never acquired uses.
 */
#include "rt_internal.h"

static const struct rt_net_driver *drivers[MFT_MAX_ENTRIES];

static const struct rt_net_driver *driver_of(solo5_handle_t h)
{
    return drivers[h] != NULL ? drivers[h] : &rt_net_hvt_driver;
}

void rt_net_set_driver(solo5_handle_t h, const struct rt_net_driver *drv)
{
    if (h < MFT_MAX_ENTRIES)
        drivers[h] = drv;
}

solo5_result_t solo5_net_acquire(const char *name, solo5_handle_t *handle,
        struct solo5_net_info *info)
{
    const struct mft_entry *e;
    solo5_handle_t h;
    solo5_result_t r = rt_mft_acquire(name, MFT_DEV_NET_BASIC, &h, &e);

    if (r != SOLO5_R_OK)
        return r;
    rt_net_set_driver(h, rt_net_shm_probe(h, e));
    *handle = h;
    memcpy(info->mac_address, e->u.net_basic.mac, SOLO5_NET_ALEN);
    info->mtu = e->u.net_basic.mtu;
    return SOLO5_R_OK;
}

/* The device (h) if it is an attached net device and (size) is a frame it
 * can send, else NULL. */
static const struct mft_entry *tx_check(solo5_handle_t h, size_t size)
{
    const struct mft_entry *e = rt_mft_entry(h, MFT_DEV_NET_BASIC);

    if (e == NULL || size > (size_t)e->u.net_basic.mtu + SOLO5_NET_HLEN)
        return NULL;
    return e;
}

solo5_result_t solo5_net_write(solo5_handle_t handle, const uint8_t *buf,
        size_t size)
{
    if (tx_check(handle, size) == NULL)
        return SOLO5_R_EINVAL;
    return driver_of(handle)->write(handle, buf, size);
}

solo5_result_t solo5_net_read(solo5_handle_t handle, uint8_t *buf,
        size_t size, size_t *read_size)
{
    const struct mft_entry *e = rt_mft_entry(handle, MFT_DEV_NET_BASIC);

    if (e == NULL || size < (size_t)e->u.net_basic.mtu + SOLO5_NET_HLEN)
        return SOLO5_R_EINVAL;
    return driver_of(handle)->read(handle, buf, size, read_size);
}

int pyvmm_net_shm_active(solo5_handle_t h)
{
    if (rt_mft_entry(h, MFT_DEV_NET_BASIC) == NULL)
        return 0;
    return driver_of(h)->shm;
}

solo5_result_t pyvmm_net_queue(solo5_handle_t h, const uint8_t *buf,
        size_t size)
{
    if (size == 0 || tx_check(h, size) == NULL)
        return SOLO5_R_EINVAL;
    return driver_of(h)->queue(h, buf, size);
}

void pyvmm_net_flush(solo5_handle_t h)
{
    if (rt_mft_entry(h, MFT_DEV_NET_BASIC) == NULL)
        return;
    const struct rt_net_driver *d = driver_of(h);
    if (d->flush != NULL)
        d->flush(h);
}

solo5_result_t pyvmm_net_tx_wait(solo5_handle_t h)
{
    if (rt_mft_entry(h, MFT_DEV_NET_BASIC) == NULL)
        return SOLO5_R_EINVAL;
    const struct rt_net_driver *d = driver_of(h);
    return d->tx_wait != NULL ? d->tx_wait(h) : SOLO5_R_OK;
}

void pyvmm_net_stats(solo5_handle_t h, struct pyvmm_net_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (rt_mft_entry(h, MFT_DEV_NET_BASIC) == NULL)
        return;
    const struct rt_net_driver *d = driver_of(h);
    if (d->stats != NULL)
        d->stats(h, out);
}

/* Where pyvmm_net_read_zc reads a frame for a back end that cannot lend one
 * (allocated on first use, one per device). */
static uint8_t *zc_buffer[MFT_MAX_ENTRIES];

solo5_result_t pyvmm_net_read_zc(solo5_handle_t h, uint8_t **frame,
        size_t *len)
{
    const struct mft_entry *e = rt_mft_entry(h, MFT_DEV_NET_BASIC);

    if (e == NULL)
        return SOLO5_R_EINVAL;
    const struct rt_net_driver *d = driver_of(h);
    if (d->read_zc != NULL)
        return d->read_zc(h, frame, len);
    size_t size = (size_t)e->u.net_basic.mtu + SOLO5_NET_HLEN;
    if (zc_buffer[h] == NULL && (zc_buffer[h] = rt_alloc(size, 64)) == NULL)
        return SOLO5_R_EUNSPEC;
    solo5_result_t r = d->read(h, zc_buffer[h], size, len);
    if (r == SOLO5_R_OK)
        *frame = zc_buffer[h];
    return r;
}

void pyvmm_net_read_done(solo5_handle_t h)
{
    if (rt_mft_entry(h, MFT_DEV_NET_BASIC) == NULL)
        return;
    const struct rt_net_driver *d = driver_of(h);
    if (d->read_done != NULL)
        d->read_done(h);
}

/*
 * Solo5 network API: checks handles and sizes, then hands the frame to the
 * device's driver (rt_internal.h).  The hypercall driver is the default.
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
    *handle = h;
    memcpy(info->mac_address, e->u.net_basic.mac, SOLO5_NET_ALEN);
    info->mtu = e->u.net_basic.mtu;
    return SOLO5_R_OK;
}

solo5_result_t solo5_net_write(solo5_handle_t handle, const uint8_t *buf,
        size_t size)
{
    const struct mft_entry *e = rt_mft_entry(handle, MFT_DEV_NET_BASIC);

    if (e == NULL || size > (size_t)e->u.net_basic.mtu + SOLO5_NET_HLEN)
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

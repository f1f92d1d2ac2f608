/*
 * Solo5 block API: checks the handle and that the transfer is whole blocks,
 * then calls the block driver.  Whether the range lies inside the capacity
 * is the tender's check (it owns the backing store), as in Solo5.
 */
#include "rt_internal.h"

solo5_result_t solo5_block_acquire(const char *name, solo5_handle_t *handle,
        struct solo5_block_info *info)
{
    const struct mft_entry *e;
    solo5_handle_t h;
    solo5_result_t r = rt_mft_acquire(name, MFT_DEV_BLOCK_BASIC, &h, &e);

    if (r != SOLO5_R_OK)
        return r;
    *handle = h;
    info->capacity = e->u.block_basic.capacity;
    info->block_size = e->u.block_basic.block_size;
    return SOLO5_R_OK;
}

static bool whole_blocks(solo5_handle_t handle, solo5_off_t offset, size_t size)
{
    const struct mft_entry *e = rt_mft_entry(handle, MFT_DEV_BLOCK_BASIC);

    if (e == NULL)
        return false;
    uint64_t bs = e->u.block_basic.block_size;
    return bs != 0 && size != 0 && offset % bs == 0 && size % bs == 0;
}

solo5_result_t solo5_block_write(solo5_handle_t handle, solo5_off_t offset,
        const uint8_t *buf, size_t size)
{
    if (!whole_blocks(handle, offset, size))
        return SOLO5_R_EINVAL;
    return rt_block_hvt_driver.write(handle, offset, buf, size);
}

solo5_result_t solo5_block_read(solo5_handle_t handle, solo5_off_t offset,
        uint8_t *buf, size_t size)
{
    if (!whole_blocks(handle, offset, size))
        return SOLO5_R_EINVAL;
    return rt_block_hvt_driver.read(handle, offset, buf, size);
}

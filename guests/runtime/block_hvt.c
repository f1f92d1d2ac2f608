/* Block driver over the block_write / block_read hypercalls. */
#include "hypercall.h"
#include "rt_internal.h"

static solo5_result_t hvt_block_write(solo5_handle_t h, solo5_off_t offset,
        const uint8_t *buf, size_t size)
{
    volatile struct hvt_hc_block_write wr = {
        .handle = h,
        .offset = offset,
        .data = (uint64_t)(uintptr_t)buf,
        .len = size,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_BLOCK_WRITE, &wr);
    return (solo5_result_t)wr.ret;
}

static solo5_result_t hvt_block_read(solo5_handle_t h, solo5_off_t offset,
        uint8_t *buf, size_t size)
{
    volatile struct hvt_hc_block_read rd = {
        .handle = h,
        .offset = offset,
        .data = (uint64_t)(uintptr_t)buf,
        .len = size,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_BLOCK_READ, &rd);
    return (solo5_result_t)rd.ret;
}

const struct rt_block_driver rt_block_hvt_driver = {
    .name = "hvt-hypercall",
    .write = hvt_block_write,
    .read = hvt_block_read,
};

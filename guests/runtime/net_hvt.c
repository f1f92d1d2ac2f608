/*
 * Net driver over the net_write / net_read hypercalls: one exit per frame.
 * Queueing is sending (there is nothing to batch), so there is no flush.
 */
#include "hypercall.h"
#include "rt_internal.h"

static solo5_result_t hvt_net_write(solo5_handle_t h, const uint8_t *buf,
        size_t size)
{
    volatile struct hvt_hc_net_write wr = {
        .handle = h,
        .data = (uint64_t)(uintptr_t)buf,
        .len = size,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_NET_WRITE, &wr);
    return (solo5_result_t)wr.ret;
}

static solo5_result_t hvt_net_read(solo5_handle_t h, uint8_t *buf, size_t size,
        size_t *read_size)
{
    volatile struct hvt_hc_net_read rd = {
        .handle = h,
        .data = (uint64_t)(uintptr_t)buf,
        .len = size,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_NET_READ, &rd);
    if (rd.ret == SOLO5_R_OK) {
        /* Never report more than the buffer holds, whatever the host says. */
        if (rd.len > size)
            return SOLO5_R_EUNSPEC;
        *read_size = rd.len;
    }
    return (solo5_result_t)rd.ret;
}

const struct rt_net_driver rt_net_hvt_driver = {
    .name = "hvt-hypercall",
    .shm = 0,
    .write = hvt_net_write,
    .read = hvt_net_read,
    .read_zc = NULL,
    .read_done = NULL,
    .queue = hvt_net_write,
    .flush = NULL,
    .tx_wait = NULL,
    .stats = NULL,
};

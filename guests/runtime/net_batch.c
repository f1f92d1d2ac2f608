/*
 * The batching and zero-copy calls under their Solo5 names
 * (solo5_net_batch.h); the pyvmm_net_* names in rt.h are the same calls.
 */
#include "rt_internal.h"
#include "solo5_net_batch.h"

solo5_result_t solo5_net_queue(solo5_handle_t handle, const uint8_t *buf,
        size_t size)
{
    return pyvmm_net_queue(handle, buf, size);
}

void solo5_net_flush(solo5_handle_t handle)
{
    pyvmm_net_flush(handle);
}

solo5_result_t solo5_net_read_zc(solo5_handle_t handle, uint8_t **frame,
        size_t *size)
{
    return pyvmm_net_read_zc(handle, frame, size);
}

void solo5_net_read_done(solo5_handle_t handle)
{
    pyvmm_net_read_done(handle);
}

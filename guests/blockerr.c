/*
 * blockerr: a host I/O error reaches the guest as SOLO5_R_EUNSPEC.
 *
 *     blockerr.hvt        (block device "storage" attached)
 *
 * Prints "ready", then reads the disk's last block over and over, as the
 * test shrinks the file behind it: the first read the host cannot complete
 * prints "ret: N" (N = SOLO5_R_EUNSPEC, 3, expected) and the guest exits 0.
 * If every read keeps succeeding for 30 s it prints "FAILURE: no error"
 * and exits 1.
 */
#include "rt.h"

GUEST_MANIFEST(MFT_BLOCK("storage"));

static uint8_t buf[4096];

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    solo5_handle_t h;
    struct solo5_block_info info;

    if (solo5_block_acquire("storage", &h, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: no block device storage\n");
        return SOLO5_EXIT_FAILURE;
    }
    solo5_off_t last = info.capacity - info.block_size;
    rt_printf("ready: capacity %lu\n", (unsigned long)info.capacity);
    solo5_time_t deadline = solo5_clock_monotonic() + 30ull * 1000000000ull;
    while (solo5_clock_monotonic() < deadline) {
        solo5_result_t ret = solo5_block_read(h, last, buf, info.block_size);
        if (ret != SOLO5_R_OK) {
            rt_printf("ret: %d\n", (int)ret);
            rt_puts("SUCCESS\n");
            return SOLO5_EXIT_SUCCESS;
        }
    }
    rt_puts("FAILURE: no error\n");
    return SOLO5_EXIT_FAILURE;
}

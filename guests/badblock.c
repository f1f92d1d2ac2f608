/*
 * badblock: block hypercalls aimed at memory the host must not write for
 * a guest, one case per run (badcall.c does the same for net and clock).
 *
 *     badblock.hvt CASE
 *
 * The cases the host must stop (it prints "FAILURE: not stopped" and exits
 * 2 if it survives):
 *   read_low    block_read into the low area (0x8000, the page table of
 *               the first 2 MiB: written, it would let the guest map the
 *               read-only low area writable)
 *   read_ro     block_read into the guest's read-only text
 * and one it must simply answer (prints "ret: 0", exits 0):
 *   write_low   block_write from the low area (the host may read there)
 *
 * Needs block device storage attached (at least one block).
 */
#include "badcase.h"
#include "hypercall.h"
#include "rt.h"

GUEST_MANIFEST(MFT_BLOCK("storage"));

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *what = rt_skip_spaces(si->cmdline);
    solo5_handle_t h;
    struct solo5_block_info info;

    if (solo5_block_acquire("storage", &h, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: no block device storage\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_printf("badblock: %s\n", what);
    if (streq(what, "read_low") || streq(what, "read_ro")) {
        volatile struct hvt_hc_block_read rd = {
            .handle = h, .offset = 0, .len = info.block_size, .ret = -1,
            .data = streq(what, "read_low") ? 0x8000 : 0x100000,
        };
        hvt_hypercall(HVT_HYPERCALL_BLOCK_READ, &rd);
        not_stopped();
    } else if (streq(what, "write_low")) {
        volatile struct hvt_hc_block_write wr = {
            .handle = h, .offset = 0, .data = 0x10000, .len = info.block_size, .ret = -1,
        };
        hvt_hypercall(HVT_HYPERCALL_BLOCK_WRITE, &wr);
        rt_printf("ret: %d\n", (int)wr.ret);
    } else {
        rt_puts("FAILURE: usage: badblock.hvt read_low|read_ro|write_low\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

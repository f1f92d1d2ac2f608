/*
 * badcall: per-frame hypercalls with bad arguments, one case per run.
 *
 *     badcall.hvt CASE
 *
 * The cases the host must stop (it prints "FAILURE: not stopped" and exits
 * 2 if it survives):
 *   walltime_ro   walltime's argument struct in the guest's read-only text
 *   poll_out      poll's argument struct past the end of guest memory
 *   read_ro       net_read into the guest's read-only text
 *   read_out      net_read into a buffer running past the end of memory
 *   write_out     net_write from a buffer past the end of memory
 *   walltime_low  walltime's argument struct in the low area (0x10000, the
 *                 boot info: the host must never write there for a guest)
 *   read_low      net_read into the low area (0x8000, a page table)
 * and the ones it must answer with EINVAL (prints "ret: 2", exits 0):
 *   write_big     net_write of a frame longer than MTU + 14
 *   read_handle   net_read on a handle the manifest does not have
 * and one it must simply answer (prints "ret: 0", exits 0):
 *   write_low     net_write of a frame read from the low area (the host may
 *                 read there: the guest can read it too)
 *
 * pyvmm answers the clean cases of these hypercalls in C and hands the rest
 * to Python (csrc/hcfast.c); this guest checks that the hand-over loses
 * none of the rules.  Needs net device service0 attached.
 */
#include "badcase.h"
#include "hypercall.h"
#include "rt.h"

GUEST_MANIFEST(MFT_NET("service0"));

static uint8_t frame[2048];

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *what = rt_skip_spaces(si->cmdline);
    uint64_t end = rt_boot_info()->mem_size;
    uint64_t text = 0x100000;
    solo5_handle_t h;
    struct solo5_net_info info;

    if (solo5_net_acquire("service0", &h, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: no net device service0\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_printf("badcall: %s\n", what);
    if (streq(what, "walltime_ro")) {
        hvt_hypercall(HVT_HYPERCALL_WALLTIME, (volatile void *)(uintptr_t)text);
        not_stopped();
    } else if (streq(what, "poll_out")) {
        hvt_hypercall(HVT_HYPERCALL_POLL, (volatile void *)(uintptr_t)(end + 0x1000));
        not_stopped();
    } else if (streq(what, "read_ro")) {
        volatile struct hvt_hc_net_read r = { .handle = h, .data = text, .len = 2048 };
        hvt_hypercall(HVT_HYPERCALL_NET_READ, &r);
        not_stopped();
    } else if (streq(what, "read_out")) {
        volatile struct hvt_hc_net_read r = { .handle = h, .data = end - 100, .len = 2048 };
        hvt_hypercall(HVT_HYPERCALL_NET_READ, &r);
        not_stopped();
    } else if (streq(what, "write_out")) {
        volatile struct hvt_hc_net_write w = { .handle = h, .data = end + 0x1000, .len = 100 };
        hvt_hypercall(HVT_HYPERCALL_NET_WRITE, &w);
        not_stopped();
    } else if (streq(what, "walltime_low")) {
        hvt_hypercall(HVT_HYPERCALL_WALLTIME, (volatile void *)(uintptr_t)0x10000);
        not_stopped();
    } else if (streq(what, "read_low")) {
        volatile struct hvt_hc_net_read r = { .handle = h, .data = 0x8000, .len = 2048 };
        hvt_hypercall(HVT_HYPERCALL_NET_READ, &r);
        not_stopped();
    } else if (streq(what, "write_low")) {
        volatile struct hvt_hc_net_write w = { .handle = h, .data = 0x10000, .len = 64 };
        hvt_hypercall(HVT_HYPERCALL_NET_WRITE, &w);
        rt_printf("ret: %d\n", (int)w.ret);
    } else if (streq(what, "write_big")) {
        volatile struct hvt_hc_net_write w = {
            .handle = h, .data = (uintptr_t)frame, .len = info.mtu + 15
        };
        hvt_hypercall(HVT_HYPERCALL_NET_WRITE, &w);
        rt_printf("ret: %d\n", (int)w.ret);
    } else if (streq(what, "read_handle")) {
        volatile struct hvt_hc_net_read r = {
            .handle = h + 9, .data = (uintptr_t)frame, .len = sizeof(frame)
        };
        hvt_hypercall(HVT_HYPERCALL_NET_READ, &r);
        rt_printf("ret: %d\n", (int)r.ret);
    } else {
        rt_puts("FAILURE: usage: badcall.hvt walltime_ro|poll_out|read_ro|read_out|"
                "write_out|walltime_low|read_low|write_low|write_big|read_handle\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

/* hello: the smallest guest.  Prints a banner, a greeting and the privilege
 * level it runs at (0, or 3 in pyvmm's user-mode profile). */
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    rt_puts("pyvmm guest runtime (Solo5 hvt ABI 2)\n");
    rt_puts("Hello, world\n");
    rt_printf("cpl: %d\n", rt_cpl());
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

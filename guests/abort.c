/* abort: solo5_abort() must end the guest with exit status 255. */
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    rt_puts("abort: calling solo5_abort()\n");
    solo5_abort();
}

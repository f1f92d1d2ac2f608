/*
 * args: prints the command line.  If its first word is a number from 0 to
 * 255, that number is the exit status; otherwise the status is 0.
 *   args.hvt 7 foo --bar   ->  "cmdline: 7 foo --bar", exit 7
 */
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    rt_printf("cmdline: %s\n", si->cmdline);

    const char *p = rt_skip_spaces(si->cmdline);
    uint64_t status;
    if (rt_parse_u64(&p, &status) && (*p == '\0' || *p == ' ' || *p == '\t')
            && status <= 255) {
        rt_printf("exit status: %d\n", (int)status);
        rt_puts("SUCCESS\n");
        return (int)status;
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}

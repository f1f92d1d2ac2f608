/*
 * Parsing numbers out of command lines: the runtime's, for guests' own
 * arguments, and bench/csrc/hostrt.c's, which compiles this file into the
 * baseline process (bench/baseline.py) so both parse alike.
 */
#include "rt.h"

const char *rt_skip_spaces(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

bool rt_parse_u64(const char **s, uint64_t *value)
{
    const char *p = *s;
    uint64_t v = 0;

    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return false;
        v = v * 10 + digit;
    }
    *s = p;
    *value = v;
    return true;
}

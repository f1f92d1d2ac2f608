/* ownlibc: a program written against solo5.h alone, that brings its own C
 * library functions as every Solo5 application does (Solo5's tests include
 * its bindings/lib.c, a MirageOS build links its libc). It must link with
 * pyvmm's runtime unchanged: the runtime's memset and friends give way
 * (weak, runtime/string.c) instead of clashing. Prints what it computed
 * with them and SUCCESS. */
#include "solo5.h"

/* The runtime's manifest note: no devices (default_manifest.c). */

static unsigned own_calls;

void *memset(void *dst, int c, size_t n)
{
    unsigned char *d = dst;
    own_calls++;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

void *memcpy(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    own_calls++;
    while (n--)
        *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    own_calls++;
    if (d < s)
        while (n--)
            *d++ = *s++;
    else
        while (n--)
            d[n] = s[n];
    return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    own_calls++;
    for (; n; n--, x++, y++)
        if (*x != *y)
            return *x - *y;
    return 0;
}

size_t strlen(const char *s)
{
    size_t n = 0;
    own_calls++;
    while (s[n])
        n++;
    return n;
}

static void puts(const char *s)
{
    solo5_console_write(s, strlen(s));
}

static void put_unsigned(unsigned v)
{
    char buf[12];
    int i = sizeof buf;
    buf[--i] = 0;
    do
        buf[--i] = (char)('0' + v % 10);
    while (v /= 10);
    puts(&buf[i]);
}

int solo5_app_main(const struct solo5_start_info *si)
{
    char a[32], b[32];

    memset(a, 'x', sizeof a);
    memcpy(b, a, sizeof b);
    memmove(b + 1, b, 8);
    puts("ownlibc: own memset/memcpy/memmove/memcmp/strlen linked\n");
    puts("cmdline: ");
    puts(si->cmdline);
    puts("\ncompare: ");
    put_unsigned(memcmp(a, b, sizeof a) == 0);
    puts("\nown calls: ");
    put_unsigned(own_calls > 0);
    puts("\nSUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
